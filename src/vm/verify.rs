//! Ahead-of-time verification of an executable, so that neither the interpreter nor compiled
//! code has to check indices at run time: every register, constant and function index, every
//! jump target and every function's bounds are checked once, here.

use super::{Arg, Constant, Executable, FuncKind, Instr, SPECIAL_REG_BEGIN, VM_REG, VOID_REG};

/// Registers one function may use; far beyond any real model, small enough to allocate.
pub const MAX_REGISTERS: i64 = 1 << 24;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{}{message}", location(.function, *.pc))]
pub struct VerifyError {
    pub function: Option<String>,
    pub pc: Option<i64>,
    pub message: String,
}

fn location(function: &Option<String>, pc: Option<i64>) -> String {
    match (function, pc) {
        (Some(f), Some(pc)) => format!("in function {f} at pc {pc}: "),
        (Some(f), None) => format!("in function {f}: "),
        _ => String::new(),
    }
}

/// An executable the verifier accepted. Only [`Verified::new`] makes one, so whatever takes a
/// `Verified` (code generation) never sees an unchecked program and never checks it again.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified(Executable);

impl Verified {
    /// Verifies `exec`.
    pub fn new(exec: Executable) -> Result<Verified, VerifyError> {
        verify(&exec)?;
        Ok(Verified(exec))
    }

    pub fn into_inner(self) -> Executable {
        self.0
    }
}

impl std::ops::Deref for Verified {
    type Target = Executable;
    fn deref(&self) -> &Executable {
        &self.0
    }
}

/// Checks `exec` (see the module's opening); [`Verified::new`] keeps the result.
pub fn verify(exec: &Executable) -> Result<(), VerifyError> {
    let fail = |function: Option<&str>, pc: Option<i64>, message: String| VerifyError {
        function: function.map(str::to_string),
        pc,
        message,
    };
    for (index, constant) in exec.constants.iter().enumerate() {
        if let Constant::Tensor(t) = constant {
            // TVM's rule (lanes ignored), as the byte format's reader applies it: a constant the
            // verifier passes must write out and read back, and kernels read exactly this much.
            let need = t
                .shape
                .iter()
                .try_fold(t.dtype.bits.div_ceil(8) as i64, |acc, &d| if d < 0 { None } else { acc.checked_mul(d) });
            if need != Some(t.data.len() as i64) {
                let need = need.map_or("an impossible size".to_string(), |n| format!("{n} bytes"));
                return Err(fail(
                    None,
                    None,
                    format!(
                        "constant {index}: a tensor of shape {:?} holds {} bytes of data, its shape and dtype need {need}",
                        t.shape,
                        t.data.len()
                    ),
                ));
            }
        }
    }
    let n_instr = exec.instr_offset.len() as i64;
    for (k, &off) in exec.instr_offset.iter().enumerate() {
        if off < 0 || off as usize >= exec.instr_data.len() {
            return Err(fail(None, None, format!("instruction {k} starts at word {off}, outside the code")));
        }
    }
    for f in &exec.funcs {
        let name = Some(f.name.as_str());
        if f.name.is_empty() {
            return Err(fail(None, None, "a function-table entry has an empty name".into()));
        }
        if f.kind == FuncKind::Packed {
            continue;
        }
        if f.num_args < 0 || f.num_args != f.param_names.len() as i64 {
            return Err(fail(
                name,
                None,
                format!("{} parameters but {} parameter names", f.num_args, f.param_names.len()),
            ));
        }
        if f.register_file_size < f.num_args || f.register_file_size > MAX_REGISTERS {
            return Err(fail(name, None, format!("register file size {} is out of range", f.register_file_size)));
        }
        if f.kind == FuncKind::Compiled {
            continue;
        }
        if !(0 <= f.start_instr && f.start_instr < f.end_instr && f.end_instr <= n_instr) {
            return Err(fail(
                name,
                None,
                format!(
                    "instruction range [{}, {}) is empty or outside the code ({n_instr} instructions)",
                    f.start_instr, f.end_instr
                ),
            ));
        }
        let regs = f.register_file_size;
        let reg_ok =
            |r: i64, allow_special: bool| (0..regs).contains(&r) || (allow_special && (r == VOID_REG || r == VM_REG));
        for k in f.start_instr..f.end_instr {
            let pc = Some(k - f.start_instr);
            let instr = exec.instr(k as usize).map_err(|e| fail(name, pc, e))?;
            let jump_ok = |off: i64| off != 0 && (f.start_instr..f.end_instr).contains(&(k + off));
            match &instr {
                Instr::Call { dst, func, args } => {
                    if !(reg_ok(*dst, false) || *dst == VOID_REG) {
                        return Err(fail(
                            name,
                            pc,
                            format!("destination register {dst} is out of range (register file has {regs})"),
                        ));
                    }
                    if !(0..exec.funcs.len() as i64).contains(func) {
                        return Err(fail(
                            name,
                            pc,
                            format!("function index {func} is out of range ({} functions)", exec.funcs.len()),
                        ));
                    }
                    for (i, a) in args.iter().enumerate() {
                        let bad = match *a {
                            Arg::Reg(r) => (!reg_ok(r, true)).then(|| {
                                if r >= SPECIAL_REG_BEGIN {
                                    format!("argument {i} is the unknown special register {r}")
                                } else {
                                    format!("argument {i} reads register %{r}, out of range (register file has {regs})")
                                }
                            }),
                            Arg::Imm(_) => None,
                            Arg::Const(c) => (!(0..exec.constants.len() as i64).contains(&c)).then(|| {
                                format!(
                                    "argument {i} reads constant c[{c}], out of range ({} constants)",
                                    exec.constants.len()
                                )
                            }),
                            Arg::Func(g) => (!(0..exec.funcs.len() as i64).contains(&g)).then(|| {
                                format!(
                                    "argument {i} names function {g}, out of range ({} functions)",
                                    exec.funcs.len()
                                )
                            }),
                        };
                        if let Some(message) = bad {
                            return Err(fail(name, pc, message));
                        }
                    }
                }
                Instr::Ret { result } => {
                    if !(reg_ok(*result, false) || *result == VOID_REG) {
                        return Err(fail(
                            name,
                            pc,
                            format!("returns register {result}, out of range (register file has {regs})"),
                        ));
                    }
                }
                Instr::Goto { offset } => {
                    if !jump_ok(*offset) {
                        return Err(fail(name, pc, format!("goto {offset} leaves the function or loops on itself")));
                    }
                }
                Instr::If { cond, false_offset } => {
                    if !reg_ok(*cond, false) {
                        return Err(fail(
                            name,
                            pc,
                            format!("condition register {cond} is out of range (register file has {regs})"),
                        ));
                    }
                    if *false_offset <= 1 || !jump_ok(*false_offset) {
                        return Err(fail(
                            name,
                            pc,
                            format!("if's false offset {false_offset} must be > 1 and stay inside the function"),
                        ));
                    }
                }
            }
            if k == f.end_instr - 1 && !matches!(instr, Instr::Ret { .. } | Instr::Goto { .. }) {
                return Err(fail(
                    name,
                    pc,
                    "the last instruction must be ret or goto (execution would run off the end)".into(),
                ));
            }
        }
    }
    Ok(())
}
