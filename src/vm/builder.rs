//! Builds an [`Executable`] function by function, as TVM's `ExecBuilder` does: packed functions
//! are declared on first use, constants are deduplicated, and instructions are appended in order.

use super::{Arg, Constant, Executable, FuncInfo, FuncKind, Instr};

#[derive(Default)]
pub struct ExecBuilder {
    exec: Executable,
    open: Option<usize>,
}

impl ExecBuilder {
    pub fn new() -> ExecBuilder {
        ExecBuilder::default()
    }

    /// The function-table index of `name`, declaring it as a packed function if it is new.
    pub fn packed(&mut self, name: &str) -> i64 {
        if let Some(i) = self.exec.func_index(name) {
            return i as i64;
        }
        self.exec.funcs.push(FuncInfo::packed(name));
        (self.exec.funcs.len() - 1) as i64
    }

    /// The function-table index of a declared Relax function, else of the packed function `name`.
    pub fn packed_or_function(&mut self, name: &str) -> i64 {
        match self.exec.func_index(name) {
            Some(i) => i as i64,
            None => self.packed(name),
        }
    }

    /// Declares (or re-declares) a Relax function so calls to it can be emitted before its body.
    pub fn declare_function(&mut self, name: &str, params: &[&str]) -> i64 {
        let info = FuncInfo {
            kind: FuncKind::Bytecode,
            name: name.to_string(),
            start_instr: 0,
            end_instr: 0,
            num_args: params.len() as i64,
            register_file_size: params.len() as i64,
            param_names: params.iter().map(|p| p.to_string()).collect(),
        };
        match self.exec.func_index(name) {
            Some(i) => {
                self.exec.funcs[i] = info;
                i as i64
            }
            None => {
                self.exec.funcs.push(info);
                (self.exec.funcs.len() - 1) as i64
            }
        }
    }

    /// Starts the body of a Relax function; instructions go to it until `end_function`.
    pub fn begin_function(&mut self, name: &str, params: &[&str]) -> i64 {
        assert!(self.open.is_none(), "begin_function while another function is open");
        let index = self.declare_function(name, params);
        let f = &mut self.exec.funcs[index as usize];
        f.start_instr = self.exec.instr_offset.len() as i64;
        self.open = Some(index as usize);
        index
    }

    /// Index the next emitted instruction will have, relative to the open function's start.
    pub fn next_pc(&self) -> i64 {
        let start = self.open.map(|i| self.exec.funcs[i].start_instr).unwrap_or(0);
        self.exec.instr_offset.len() as i64 - start
    }

    pub fn emit(&mut self, instr: Instr) {
        assert!(self.open.is_some(), "emit outside a function");
        self.exec.instr_offset.push(self.exec.instr_data.len() as i64);
        instr.encode(&mut self.exec.instr_data);
    }

    pub fn call(&mut self, dst: i64, func: i64, args: Vec<Arg>) {
        self.emit(Instr::Call { dst, func, args });
    }

    /// Patches the offset of a Goto or If emitted at function-relative `pc`.
    pub fn patch_offset(&mut self, pc: i64, offset: i64) {
        let start = self.open.map(|i| self.exec.funcs[i].start_instr).unwrap_or(0);
        let word = self.exec.instr_offset[(start + pc) as usize] as usize;
        match self.exec.instr_data[word] {
            super::OP_GOTO => self.exec.instr_data[word + 1] = offset,
            super::OP_IF => self.exec.instr_data[word + 2] = offset,
            op => panic!("patch_offset on opcode {op}"),
        }
    }

    pub fn end_function(&mut self, register_file_size: i64) {
        let index = self.open.take().expect("end_function without begin_function");
        let f = &mut self.exec.funcs[index];
        f.end_instr = self.exec.instr_offset.len() as i64;
        f.register_file_size = register_file_size.max(f.num_args);
    }

    /// The pool index of a constant, reusing an equal one.
    pub fn constant(&mut self, c: Constant) -> i64 {
        if let Some(i) = self.exec.constants.iter().position(|k| constant_eq(k, &c)) {
            return i as i64;
        }
        self.exec.constants.push(c);
        (self.exec.constants.len() - 1) as i64
    }

    pub fn build(self) -> Executable {
        assert!(self.open.is_none(), "build with a function still open");
        self.exec
    }
}

/// Structural equality that also treats floats bit for bit (so NaN constants deduplicate).
fn constant_eq(a: &Constant, b: &Constant) -> bool {
    match (a, b) {
        (Constant::Float(x), Constant::Float(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}
