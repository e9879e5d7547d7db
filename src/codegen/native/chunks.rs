//! Cutting long functions into chunks. Cranelift's register allocator is superlinear in
//! function size (one 30,000-instruction function took 13 s), so a Relax function longer than
//! [`CHUNK_INSTRS`] is cut where no jump crosses, each chunk becomes a native function, and a
//! small driver calls them in turn. Length is counted in instructions that become code: those a
//! rolled loop folds away weigh nothing (`plan::chunk_weights`), so a long run of repeated calls
//! stays whole, in one loop, rather than paying for a chunk boundary every 1500 instructions.

use cranelift_codegen::ir::InstBuilder;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_frontend::FunctionBuilder;
use cranelift_module::{FuncId, Module};
use cranelift_object::ObjectModule;

use crate::vm::Instr;

/// Most instructions lowered into one native function.
pub const CHUNK_INSTRS: usize = 1500;

/// What a chunk returns when execution continues in the next one (0 is success, -1 failure).
pub const CONTINUE: i64 = 1;

/// The [lo, hi) instruction ranges of the chunks, each weighing at most [`CHUNK_INSTRS`] where
/// the jumps allow (`weights`: per instruction).
pub fn chunk_bounds(instrs: &[Instr], weights: &[u32]) -> Vec<(usize, usize)> {
    let n = instrs.len();
    // crossed[p]: some jump spans the boundary between p-1 and p.
    let mut delta = vec![0i64; n + 2];
    for (i, ins) in instrs.iter().enumerate() {
        let off = match ins {
            Instr::Goto { offset } => *offset,
            Instr::If { false_offset, .. } => *false_offset,
            _ => continue,
        };
        let t = (i as i64 + off) as usize;
        let (a, b) = (i.min(t), i.max(t));
        delta[a + 1] += 1;
        delta[b + 1] -= 1;
    }
    let mut crossed = vec![false; n + 1];
    let mut depth = 0;
    for (p, c) in crossed.iter_mut().enumerate() {
        depth += delta[p];
        *c = depth > 0;
    }
    // weight_to[p]: the weight of instructions [0, p).
    let weight_to: Vec<usize> = std::iter::once(0)
        .chain(weights.iter().scan(0, |sum, &w| {
            *sum += w as usize;
            Some(*sum)
        }))
        .collect();
    let mut bounds = Vec::new();
    let mut start = 0;
    while weight_to[n] - weight_to[start] > CHUNK_INSTRS {
        // The furthest end keeping the chunk within its weight (at least one instruction).
        let limit = weight_to.partition_point(|&w| w <= weight_to[start] + CHUNK_INSTRS).saturating_sub(1);
        let limit = limit.clamp(start + 1, n);
        let cut = (start + 1..=limit)
            .rev()
            .find(|&p| !crossed[p])
            .or_else(|| (limit + 1..n).find(|&p| !crossed[p]))
            .unwrap_or(n);
        bounds.push((start, cut));
        start = cut;
    }
    if start < n {
        bounds.push((start, n));
    }
    bounds
}

/// The native function of a chunked Relax function: runs the chunks until one returns or fails.
pub fn chunk_driver(module: &mut ObjectModule, b: &mut FunctionBuilder, parts: &[FuncId]) {
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    for (k, part) in parts.iter().enumerate() {
        let f = module.declare_func_in_func(*part, b.func);
        b.func.dfg.ext_funcs[f].colocated = true;
        let call = b.ins().call(f, &params);
        let rc = b.inst_results(call)[0];
        if k + 1 == parts.len() {
            b.ins().return_(&[rc]);
        } else {
            let (next, done) = (b.create_block(), b.create_block());
            let more = b.ins().icmp_imm_s(IntCC::Equal, rc, CONTINUE);
            b.ins().brif(more, next, &[], done, &[]);
            b.switch_to_block(done);
            b.ins().return_(&[rc]);
            b.switch_to_block(next);
        }
    }
    b.seal_all_blocks();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::Instr;

    fn call() -> Instr {
        Instr::Call { dst: 0, func: 0, args: Vec::new() }
    }

    #[test]
    fn long_straight_code_is_cut_every_chunk() {
        let instrs = vec![call(); 2 * CHUNK_INSTRS + 10];
        assert_eq!(
            chunk_bounds(&instrs, &vec![1; instrs.len()]),
            [(0, CHUNK_INSTRS), (CHUNK_INSTRS, 2 * CHUNK_INSTRS), (2 * CHUNK_INSTRS, 2 * CHUNK_INSTRS + 10)]
        );
    }

    #[test]
    fn no_cut_falls_inside_a_jump() {
        let mut instrs = vec![call(); CHUNK_INSTRS + 100];
        // A loop from CHUNK_INSTRS + 20 back to 10 covers the natural cut point.
        instrs[CHUNK_INSTRS + 20] = Instr::Goto { offset: -(CHUNK_INSTRS as i64 + 10) };
        let bounds = chunk_bounds(&instrs, &vec![1; instrs.len()]);
        // The first chunk ends before the loop; the second takes the loop whole, past the usual size.
        assert_eq!(bounds, [(0, 10), (10, CHUNK_INSTRS + 21), (CHUNK_INSTRS + 21, CHUNK_INSTRS + 100)]);
    }

    #[test]
    fn instructions_a_loop_folds_away_weigh_nothing() {
        let instrs = vec![call(); 3 * CHUNK_INSTRS];
        let mut weights = vec![1; instrs.len()];
        // A rolled run over most of the function: one chunk holds it all.
        weights[100..3 * CHUNK_INSTRS - 100].iter_mut().for_each(|w| *w = 0);
        assert_eq!(chunk_bounds(&instrs, &weights), [(0, 3 * CHUNK_INSTRS)]);
        // Weight only at the ends, more than a chunk's: cut where the weight runs out.
        weights[..CHUNK_INSTRS].iter_mut().for_each(|w| *w = 1);
        weights[CHUNK_INSTRS..2 * CHUNK_INSTRS].iter_mut().for_each(|w| *w = 0);
        weights[2 * CHUNK_INSTRS..].iter_mut().for_each(|w| *w = 1);
        assert_eq!(chunk_bounds(&instrs, &weights), [(0, 2 * CHUNK_INSTRS), (2 * CHUNK_INSTRS, 3 * CHUNK_INSTRS)]);
    }
}
