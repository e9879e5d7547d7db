//! The CLIF of compiled-mode functions as text, for `relaxc compile --emit-clif`: each run of
//! Cranelift instructions that implements one bytecode instruction is headed by a
//! `; pc=N <instruction>` comment, so generated code reads against the listing it came from.
//! The pc travels on each instruction's source location, set while lowering, and on into the
//! machine code, which is how each function's summary counts bytes per kind of instruction.

use std::collections::BTreeMap;
use std::fmt::{self, Write};

use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{Block, Function, Inst, SourceLoc, Value};
use cranelift_codegen::write::{FuncWriter, PlainWriter, decorate_function};

/// The source location of a rolled loop's back edge (its counter step and branch): no pc, so
/// that the machine code's back edge can be found (native/align.rs). Counted outside every
/// instruction.
pub fn loop_back_edge() -> SourceLoc {
    SourceLoc::new(u32::MAX - 1)
}

/// Writes a function, annotating where each bytecode instruction's code begins.
struct PcCommentWriter<'a> {
    /// The listing line of each instruction of the function, indexed by pc.
    listing: &'a dyn Fn(u32) -> Option<String>,
    last: SourceLoc,
}

impl FuncWriter for PcCommentWriter<'_> {
    fn write_block_header(&mut self, w: &mut dyn Write, func: &Function, block: Block, indent: usize) -> fmt::Result {
        // Blocks do not restate the pc: each instruction's `@` prefix already carries it.
        PlainWriter.write_block_header(w, func, block, indent)
    }

    fn write_instruction(
        &mut self,
        w: &mut dyn Write,
        func: &Function,
        aliases: &SecondaryMap<Value, Vec<Value>>,
        inst: Inst,
        indent: usize,
    ) -> fmt::Result {
        let loc = func.srcloc(inst);
        if loc != self.last && loc == loop_back_edge() {
            writeln!(w, "{:indent$}; the loop's back edge", "")?;
        } else if loc != self.last && !loc.is_default() {
            let pc = loc.bits();
            let text = (self.listing)(pc).unwrap_or_default();
            writeln!(w, "{:indent$}; pc={pc} {text}", "")?;
        }
        self.last = loc;
        PlainWriter.write_instruction(w, func, aliases, inst, indent)
    }
}

/// `func` as CLIF text with `; pc=N` comments; `listing(pc)` gives the instruction's text.
pub fn annotated(func: &Function, listing: &dyn Fn(u32) -> Option<String>) -> String {
    let mut out = String::new();
    let mut writer = PcCommentWriter { listing, last: SourceLoc::default() };
    // Writing into a String cannot fail.
    let _ = decorate_function(&mut writer, &mut out, func);
    out
}

/// How many bytes of machine code each kind of bytecode instruction became, as CLIF comments.
/// Bytes without a source location (the prologue, the shared error path, and many small pieces
/// between instructions) are counted as outside every instruction.
/// `spans` are (pc as a source location, bytes); `kind(pc)` names the instruction's callee.
pub fn size_summary<'a>(
    total: u32,
    spans: impl Iterator<Item = (SourceLoc, u32)>,
    kind: &dyn Fn(u32) -> &'a str,
) -> String {
    let mut by_pc: BTreeMap<u32, u32> = BTreeMap::new();
    for (loc, bytes) in spans.filter(|(loc, _)| !loc.is_default() && *loc != loop_back_edge()) {
        *by_pc.entry(loc.bits()).or_default() += bytes;
    }
    let inside: u32 = by_pc.values().sum();
    let mut by_kind: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for (&pc, &bytes) in &by_pc {
        let entry = by_kind.entry(kind(pc)).or_default();
        entry.0 += 1;
        entry.1 += bytes;
    }
    let mut rows: Vec<_> = by_kind.into_iter().collect();
    rows.sort_by_key(|(_, (_, bytes))| std::cmp::Reverse(*bytes));
    let mut out = format!(
        "; machine code: {total} bytes, {inside} for {} instructions, {} outside them\n",
        by_pc.len(),
        total.saturating_sub(inside)
    );
    for (name, (count, bytes)) in rows {
        let _ = writeln!(out, ";   {name:<32} {count:>6} x {:>5} bytes = {bytes}", bytes / count.max(1));
    }
    out
}
