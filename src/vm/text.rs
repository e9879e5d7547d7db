//! TVM's three text forms of an executable, reproduced exactly: `as_text()` (the listing),
//! `as_python()` (builder calls) and `stats()`.

use std::fmt::Write;

use super::{Arg, Constant, Executable, FuncKind, Instr, VM_REG, VOID_REG};

fn reg_name(r: i64) -> String {
    match r {
        VOID_REG => "%void".to_string(),
        VM_REG => "%vm".to_string(),
        _ => format!("%{r}"),
    }
}

impl Executable {
    fn func_name(&self, index: i64) -> String {
        match usize::try_from(index).ok().and_then(|i| self.funcs.get(i)) {
            Some(f) => f.name.clone(),
            None => format!("unknown_func_index({index})"),
        }
    }

    fn arg_text(&self, a: Arg) -> String {
        match a {
            Arg::Reg(r) => reg_name(r),
            Arg::Imm(v) => format!("i{v}"),
            Arg::Const(c) => format!("c[{c}]"),
            Arg::Func(f) => format!("f[{}]", self.func_name(f)),
        }
    }

    /// A function's instruction range cut to the instructions that exist (for unverified input).
    pub(crate) fn clamped_range(&self, start: i64, end: i64) -> std::ops::Range<i64> {
        let n = self.instr_offset.len() as i64;
        start.clamp(0, n)..end.clamp(0, n)
    }

    /// The listing TVM's `as_text()` prints.
    pub fn as_text(&self) -> String {
        let mut out = String::new();
        for f in &self.funcs {
            match f.kind {
                FuncKind::Packed => {
                    let _ = writeln!(out, "@{} packed_func;\n", f.name);
                }
                FuncKind::Compiled => {
                    let _ = writeln!(out, "@{} num_inputs={} vm_tir_func;\n", f.name, f.num_args);
                }
                FuncKind::Bytecode => {
                    let _ = writeln!(out, "@{}:", f.name);
                    for k in self.clamped_range(f.start_instr, f.end_instr) {
                        let line = match self.instr(k as usize) {
                            Ok(i) => self.instr_text(&i),
                            Err(e) => format!("<bad instruction: {e}>"),
                        };
                        let _ = writeln!(out, "  {line}");
                    }
                    out.push('\n');
                }
            }
        }
        out
    }

    /// One instruction as `as_text` prints it (without the indent).
    pub fn instr_text(&self, instr: &Instr) -> String {
        match instr {
            Instr::Call { dst, func, args } => {
                let args: Vec<String> = args.iter().map(|a| self.arg_text(*a)).collect();
                format!(
                    "{:<6}{:<16} in: {:<12} dst: {}",
                    "call",
                    self.func_name(*func),
                    args.join(", "),
                    reg_name(*dst)
                )
            }
            Instr::Ret { result } => format!("{:<6}{}", "ret ", reg_name(*result)),
            Instr::Goto { offset } => format!("{:<6}{}", "goto", offset),
            Instr::If { cond, false_offset } => format!("{:<6}{}, {}", "If", reg_name(*cond), false_offset),
        }
    }

    /// The builder script TVM's `as_python()` prints.
    pub fn as_python(&self) -> String {
        let mut out = String::from("ib = rx.Builder()\n");
        for f in self.funcs.iter().filter(|f| f.kind == FuncKind::Bytecode) {
            let _ = writeln!(out, "with ib.function(\"{}\", num_inputs={}):", f.name, f.num_args);
            for k in self.clamped_range(f.start_instr, f.end_instr) {
                let line = match self.instr(k as usize) {
                    Ok(Instr::Call { dst, func, args }) => {
                        let args: Vec<String> = args.iter().map(|a| self.arg_python(*a)).collect();
                        let dst = if dst == VOID_REG { String::new() } else { format!(", dst=ib.r({dst})") };
                        format!("ib.emit_call(\"{}\", args=[{}]{dst})", self.func_name(func), args.join(", "))
                    }
                    Ok(Instr::Ret { result }) => format!("ib.emit_ret(ib.r({result}))"),
                    Ok(Instr::Goto { offset }) => format!("ib.emit_goto({offset})"),
                    Ok(Instr::If { cond, false_offset }) => format!("ib.emit_if(ib.r({cond}), {false_offset})"),
                    Err(e) => format!("# bad instruction: {e}"),
                };
                let _ = writeln!(out, "    {line}");
            }
        }
        out
    }

    fn arg_python(&self, a: Arg) -> String {
        match a {
            Arg::Reg(VM_REG) => "ib.r(vm)".to_string(),
            Arg::Reg(r) => format!("ib.r({r})"),
            Arg::Imm(v) => format!("ib.imm({v})"),
            Arg::Const(c) => format!("ib.c({c})"),
            Arg::Func(f) => format!("ib.f(\"{}\")", self.func_name(f)),
        }
    }

    /// The summary TVM's `stats()` prints. TVM cannot print Float constants (it throws); relaxc
    /// prints their value.
    pub fn stats(&self) -> String {
        let consts: Vec<String> = self
            .constants
            .iter()
            .map(|c| match c {
                Constant::Tensor(t) if t.shape.is_empty() => "scalar".to_string(),
                Constant::Tensor(t) => format!("[{}]", join(&t.shape)),
                // TVM's printer drops the last character before "]", so an empty shape reads
                // "shapetupl]"; reproduced for identical output.
                Constant::Shape(s) if s.is_empty() => "shapetupl]".to_string(),
                Constant::Shape(s) => format!("shapetuple[{}]", join(s)),
                Constant::Str(s) => format!("\"{s}\""),
                Constant::Int(v) => v.to_string(),
                Constant::Float(v) => format!("{v:?}"),
                Constant::DataType(d) => d.to_string(),
            })
            .collect();
        let globals: Vec<&str> = self.funcs.iter().map(|f| f.name.as_str()).collect();
        format!(
            "Relax VM executable statistics:\n  Constant pool (# {}): [{}]\n  Globals (#{}): [{}]\n",
            self.constants.len(),
            consts.join(", "),
            self.funcs.len(),
            globals.join(", ")
        )
    }
}

fn join(v: &[i64]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}
