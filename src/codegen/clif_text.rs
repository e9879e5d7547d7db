//! The CLIF of compiled-mode functions as text, for `relaxc compile --emit-clif`: each run of
//! Cranelift instructions that implements one bytecode instruction is headed by a
//! `; pc=N <instruction>` comment, so generated code reads against the listing it came from.
//! The pc travels on each instruction's source location, set while lowering.

use std::fmt::{self, Write};

use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{Block, Function, Inst, SourceLoc, Value};
use cranelift_codegen::write::{FuncWriter, PlainWriter, decorate_function};

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
        if loc != self.last && !loc.is_default() {
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
