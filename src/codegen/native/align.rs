//! Where a rolled loop's code lies: its back edge, written here and shortened after Cranelift
//! so that a loop of two calls fits in one 64-byte line, and its alignment: a compiled
//! function's rolled loop starts on a 64-byte boundary (its last one, when it has several).
//!
//! Cranelift lays blocks end to end and aligns only the function. A rolled chain's loop is a few
//! call sites, and where its first byte falls against the CPU's 32- and 64-byte fetch blocks moved
//! chain_1000 by several percent on Zen 3 (GCC and LLVM align loop headers for the same reason).
//! Cranelift has no such option on x86-64, so the function is aligned to 64 and begins with
//! `nop`s that push its loop header to the next boundary: the entry runs through at most 63
//! bytes of them (a handful of long `nop`s) once per call.

use cranelift_codegen::CompiledCode;
use cranelift_codegen::ir::{Block, BlockArg, InstBuilder, SourceLoc, Value, types};
use cranelift_frontend::FunctionBuilder;

use crate::codegen::clif_text::loop_back_edge;

/// Where loop headers are aligned to.
const LOOP_ALIGN: usize = 64;

/// The recommended x86 `nop` of each length 1-9 (Intel's manual, "NOP" instruction).
const X86_NOPS: [&[u8]; 9] = [
    &[0x90],
    &[0x66, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// The bytes of padding that put the header of `code`'s loop (the target of the back edge
/// marked loop_back_edge()) on a LOOP_ALIGN boundary, when the function starts on one. 0 when
/// the back edge is not code this can read, or when padding would move constants inside the
/// buffer off their alignment.
pub fn loop_padding(code: &CompiledCode) -> usize {
    let bytes = code.buffer.data();
    let spans = code.buffer.get_srclocs_sorted();
    let Some(edge) = spans.iter().filter(|s| s.loc == loop_back_edge()).max_by_key(|s| s.end) else { return 0 };
    // The last marked span is the count's test and the conditional back edge; a jump that
    // Cranelift writes on its own (after a compare) carries no location and follows the span.
    let target = |at: u32| x86_back_edge_target(bytes, at as usize);
    let Some(header) = target(edge.start).or_else(|| target(edge.end)) else { return 0 };
    let padding = (LOOP_ALIGN - header % LOOP_ALIGN) % LOOP_ALIGN;
    if !padding.is_multiple_of(code.buffer.alignment.max(1) as usize) {
        return 0;
    }
    padding
}

/// The target of the first backward jump at or after `at` in `code`, reading only what
/// Cranelift puts between a loop's counter step and its back edge: conditional jumps (to the
/// exit), register moves and tests. None on anything else.
fn x86_back_edge_target(code: &[u8], mut at: usize) -> Option<usize> {
    let byte = |k: usize| code.get(k).copied();
    let rel32 = |k: usize| Some(i32::from_le_bytes(code.get(k..k + 4)?.try_into().ok()?) as i64);
    for _ in 0..4 {
        let (len, rel) = match (byte(at)?, byte(at + 1)) {
            (0xe9, _) => (5, rel32(at + 1)),
            (0xeb, Some(d)) => (2, Some(d as i8 as i64)),
            (0x0f, Some(0x80..=0x8f)) => (6, rel32(at + 2)),
            (0x70..=0x7f, Some(d)) => (2, Some(d as i8 as i64)),
            // mov or test between 64-bit registers (REX.W, 89, 8b or 85, a register ModRM).
            (0x48..=0x4f, Some(0x89 | 0x8b | 0x85)) if byte(at + 2)? >= 0xc0 => (3, None),
            _ => return None,
        };
        if let Some(rel) = rel {
            let target = (at + len) as i64 + rel;
            if target < at as i64 {
                return (target >= 0).then_some(target as usize);
            }
        }
        at += len;
    }
    None
}

/// Writes a rolled loop's back edge: counts `remaining` down and goes back to `header` until it
/// reaches 0, then on to `exit`. Marked with loop_back_edge() for the functions here to find.
/// `isub` of 1, not `iadd` of -1: Cranelift writes an `iadd`'s immediate in 4 bytes, an
/// `isub`'s in 1.
pub fn back_edge(b: &mut FunctionBuilder, remaining: Value, header: Block, exit: Block) {
    b.set_srcloc(loop_back_edge());
    let one = b.ins().iconst(types::I64, 1);
    let next = b.ins().isub(remaining, one);
    b.ins().brif(next, header, &[BlockArg::Value(next)], exit, &[]);
    b.set_srcloc(SourceLoc::default());
}

/// Shortens the back edge of each rolled loop in `code`, a compiled function's bytes, in place:
/// `sub r, 1; test r, r; jne header` becomes `sub r, 1; jne header` with a one-byte
/// displacement, and the 7 bytes saved become a `nop` after the loop, run once on the way out.
/// `sub` has set the flags `test` would, nothing else in the function moves, and nothing jumps to
/// the bytes replaced (they are inside one block). Cranelift writes every jump with a 4-byte
/// displacement, and this made a chain's loop of two calls 69 bytes, over a 64-byte line where
/// its 62 fit: on Zen 3, a C loop of the same calls ran 6% slower made 71 bytes than at 53. A
/// back edge that is not exactly this pattern, or whose header is out of reach, is left alone.
pub fn shorten_back_edges(code: &mut [u8], compiled: &CompiledCode) {
    // The function's own bytes may come after padding.
    let start = code.len() - compiled.buffer.data().len();
    let spans = compiled.buffer.get_srclocs_sorted();
    let edges = spans.iter().filter(|s| s.loc == loop_back_edge());
    // The span starts at the `sub` or, when Cranelift files it under the body, right after.
    for edge in edges {
        let at = start + edge.start as usize;
        if !shorten_back_edge(code, at) {
            shorten_back_edge(code, at.wrapping_sub(4));
        }
    }
}

/// Rewrites `sub r, 1; test r, r; jne rel32` at `at` as `sub r, 1; jne rel8; nop`, if that
/// is what is there and the target is in reach. Whether it did.
fn shorten_back_edge(code: &mut [u8], at: usize) -> bool {
    let Some(&[rex, 0x83, modrm, 0x01, test_rex, 0x85, test_modrm, 0x0f, 0x85, d0, d1, d2, d3]) =
        code.get(at..at.saturating_add(13))
    else {
        return false;
    };
    // `sub r64, 1` (REX.W 83 /5 ib), then `test` of the same register with itself.
    let reg = modrm & 7;
    let same_register = rex & 0xf8 == 0x48
        && modrm & 0xf8 == 0xe8
        && test_rex == rex | ((rex & 1) << 2)
        && test_modrm == 0xc0 | (reg << 3) | reg;
    let header = (at + 13) as i64 + i32::from_le_bytes([d0, d1, d2, d3]) as i64;
    let jne_end = at + 6;
    let rel8 = header - jne_end as i64;
    if !same_register || !(-128..0).contains(&rel8) {
        return false;
    }
    code[at + 4] = 0x75;
    code[at + 5] = rel8 as i8 as u8;
    code[jne_end..at + 13].copy_from_slice(&x86_nops(7));
    true
}

/// `n` bytes of x86 `nop`s, as few instructions as the longest `nop` allows.
pub fn x86_nops(mut n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while n > 0 {
        let take = n.min(X86_NOPS.len());
        out.extend_from_slice(X86_NOPS[take - 1]);
        n -= take;
    }
    out
}

/// The alignment a padded function needs for its padding to land the loop where intended.
pub const PADDED_FUNCTION_ALIGN: u64 = LOOP_ALIGN as u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nops_have_the_length_asked_for() {
        for n in 0..100 {
            assert_eq!(x86_nops(n).len(), n);
        }
        // 20 bytes: two 9-byte nops and a 2-byte one.
        assert_eq!(x86_nops(20)[18..], [0x66, 0x90]);
    }

    #[test]
    fn reads_back_edges() {
        // je +8 (to the exit), mov r12, rcx, jmp back to 0x10: Cranelift's rolled loop.
        let mut code = vec![0x90; 0x40];
        code.extend([0x0f, 0x84, 0x08, 0x00, 0x00, 0x00, 0x49, 0x89, 0xcc, 0xe9]);
        let end = code.len() as i32 + 4;
        code.extend((0x10 - end).to_le_bytes());
        assert_eq!(x86_back_edge_target(&code, 0x40), Some(0x10));
        // jne rel8 straight back, and test r12, r12 before it (a count down to 0).
        assert_eq!(x86_back_edge_target(&[0x90, 0x90, 0x75, 0xfc], 2), Some(0));
        assert_eq!(x86_back_edge_target(&[0x90, 0x90, 0x4d, 0x85, 0xe4, 0x75, 0xf9], 2), Some(0));
        // Something else first, or only forward jumps.
        assert_eq!(x86_back_edge_target(&[0x48, 0x8b, 0x04, 0x24], 0), None);
        assert_eq!(x86_back_edge_target(&[0xe9, 0x10, 0x00, 0x00, 0x00], 0), None);
    }

    #[test]
    fn shortens_count_down_back_edges() {
        // 0x40 bytes of body, then sub r14, 1; test r14, r14; jne back to 0.
        let mut code = vec![0x90; 0x40];
        code.extend([0x49, 0x83, 0xee, 0x01, 0x4d, 0x85, 0xf6, 0x0f, 0x85]);
        code.extend((-(0x40i32 + 13)).to_le_bytes());
        let before = code.clone();
        assert!(shorten_back_edge(&mut code, 0x40));
        assert_eq!(code[0x44..0x46], [0x75, (-(0x46i8)) as u8]);
        assert_eq!(code[0x46..], x86_nops(7)[..]);
        assert_eq!(x86_back_edge_target(&code, 0x44), Some(0));
        // Another register in the test, a subtraction of 2, or a target out of rel8's reach.
        for (at, byte) in [(0x46, 0xf6 ^ 1), (0x43, 2)] {
            let mut other = before.clone();
            other[at] = byte;
            assert!(!shorten_back_edge(&mut other, 0x40));
        }
        let mut far = vec![0x90; 0x100];
        far.extend_from_slice(&before[0x40..0x49]);
        far.extend((-(0x100i32 + 13)).to_le_bytes());
        assert!(!shorten_back_edge(&mut far, 0x100));
        // Low registers (sub rcx, 1; test rcx, rcx) too.
        let mut low = vec![0x48, 0x83, 0xe9, 0x01, 0x48, 0x85, 0xc9, 0x0f, 0x85];
        low.extend((-13i32).to_le_bytes());
        assert!(shorten_back_edge(&mut low, 0));
    }
}
