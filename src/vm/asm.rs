//! relaxc's text form of an executable, which assembles back to the same bytes: TVM's `as_text`
//! lines for instructions, plus what that listing leaves out (the constant pool, parameter
//! names, register counts, memory scopes). Instruction-level tests and hand-written programs
//! can be text; `relaxc inspect --asm` prints it.
//!
//! ```text
//! relaxc-asm 1
//! const 0 dtype float32
//! const 1 str "global"
//! const 2 shape 2,3
//! const 3 tensor float32 2,3 0000803f...
//! scope 1 "global"
//! func main bytecode at=0 regs=4 params=x,w
//!   call  add              in: %0, %1, %2   dst: %void
//!   ret   %2              # a comment
//! func add packed
//! ```

use std::fmt::Write;

use super::{Arg, Constant, DType, Executable, FuncInfo, FuncKind, Instr, TensorConst, VM_REG, VOID_REG};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct AsmError {
    pub line: usize,
    pub message: String,
}

fn dtype_text(d: DType) -> String {
    match (d.code, d.lanes) {
        (0 | 1 | 2 | 4 | 6, 1) if d.code != 6 || d.bits == 8 => d.to_string(),
        _ => format!("{}:{}:{}", d.code, d.bits, d.lanes),
    }
}

fn parse_dtype(s: &str) -> Option<DType> {
    if let Some((code, rest)) = s.split_once(':') {
        let (bits, lanes) = rest.split_once(':')?;
        return Some(DType::new(code.parse().ok()?, bits.parse().ok()?, lanes.parse().ok()?));
    }
    DType::parse(s)
}

fn ints(v: &[i64]) -> String {
    if v.is_empty() { "-".into() } else { v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",") }
}

fn parse_ints(s: &str) -> Option<Vec<i64>> {
    if s == "-" { Some(Vec::new()) } else { s.split(',').map(|d| d.parse().ok()).collect() }
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "-".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(s: &str) -> Option<Vec<u8>> {
    if s == "-" {
        return Some(Vec::new());
    }
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// A quoted string as Rust's Debug writes it, and back.
fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '\'' => out.push('\''),
            'u' => {
                let rest: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let code = u32::from_str_radix(rest.strip_prefix('{')?, 16).ok()?;
                out.push(char::from_u32(code)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The text form of an executable.
pub fn disassemble(exec: &Executable) -> String {
    let mut out = String::from("relaxc-asm 1\n");
    for (i, c) in exec.constants.iter().enumerate() {
        let body = match c {
            Constant::Tensor(t) => format!("tensor {} {} {}", dtype_text(t.dtype), ints(&t.shape), hex(&t.data)),
            Constant::Shape(s) => format!("shape {}", ints(s)),
            Constant::Str(s) => format!("str {s:?}"),
            Constant::Int(v) => format!("int {v}"),
            Constant::Float(v) => format!("float {:#018x}", v.to_bits()),
            Constant::DataType(d) => format!("dtype {}", dtype_text(*d)),
        };
        let _ = writeln!(out, "const {i} {body}");
    }
    for (index, scope) in &exec.memory_scopes {
        let _ = writeln!(out, "scope {index} {scope:?}");
    }
    for f in &exec.funcs {
        let params = if f.param_names.is_empty() { "-".to_string() } else { f.param_names.join(",") };
        match f.kind {
            FuncKind::Packed => {
                let _ = writeln!(out, "func {} packed", f.name);
            }
            FuncKind::Compiled => {
                let _ = writeln!(out, "func {} compiled regs={} params={params}", f.name, f.register_file_size);
            }
            FuncKind::Bytecode => {
                let _ = writeln!(
                    out,
                    "func {} bytecode at={} regs={} params={params}",
                    f.name, f.start_instr, f.register_file_size
                );
                // Clamped: an unverified executable may claim any range.
                for k in exec.clamped_range(f.start_instr, f.end_instr) {
                    match exec.instr(k as usize) {
                        Ok(i) => {
                            let _ = writeln!(out, "  {}", exec.instr_text(&i));
                        }
                        Err(e) => {
                            let _ = writeln!(out, "  # bad instruction: {e}");
                        }
                    }
                }
            }
        }
    }
    out
}

/// A bytecode function's instructions as read, laid out once every function is known.
struct Body {
    func: usize,
    /// The `func` line, for errors.
    line: usize,
    at: i64,
    lines: Vec<(usize, String)>,
}

/// Parses the text form back into an executable (verify it before use).
pub fn assemble(text: &str) -> Result<Executable, AsmError> {
    let mut exec = Executable::default();
    let mut bodies: Vec<Body> = Vec::new();
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    match lines.next() {
        Some((_, "relaxc-asm 1")) => {}
        _ => return Err(AsmError { line: 1, message: "expected the header `relaxc-asm 1`".into() }),
    }
    for (n, raw) in lines {
        let err = |message: String| AsmError { line: n, message };
        let line = raw.trim_end();
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with("  ") {
            let Some(last) = bodies.last_mut() else {
                return Err(err("an instruction outside a bytecode function".into()));
            };
            // An instruction line may end in a comment after whitespace; names and operands
            // never contain a space.
            let code = line.find(" #").map_or(line, |at| &line[..at]);
            last.lines.push((n, code.trim().to_string()));
            continue;
        }
        let mut words = line.splitn(3, ' ');
        match (words.next(), words.next(), words.next()) {
            (Some("const"), Some(index), Some(body)) => {
                if index.parse::<usize>().ok() != Some(exec.constants.len()) {
                    return Err(err(format!("constant {index} is out of order")));
                }
                exec.constants.push(parse_constant(body).ok_or_else(|| err(format!("bad constant `{body}`")))?);
            }
            (Some("scope"), Some(index), Some(name)) => {
                let index = index.parse().map_err(|_| err("bad scope index".into()))?;
                exec.memory_scopes.push((index, unquote(name).ok_or_else(|| err("bad scope name".into()))?));
            }
            (Some("func"), Some(name), rest) => {
                let mut f = FuncInfo::packed(name);
                let mut at = 0;
                let mut fields = rest.unwrap_or("").split(' ');
                let kind = fields.next().unwrap_or("");
                for field in fields {
                    let (k, v) = field.split_once('=').ok_or_else(|| err(format!("bad field `{field}`")))?;
                    match k {
                        "at" => at = v.parse().map_err(|_| err("bad at=".into()))?,
                        "regs" => f.register_file_size = v.parse().map_err(|_| err("bad regs=".into()))?,
                        "params" if v != "-" => f.param_names = v.split(',').map(str::to_string).collect(),
                        "params" => {}
                        _ => return Err(err(format!("unknown field `{k}`"))),
                    }
                }
                f.kind = match kind {
                    "packed" => FuncKind::Packed,
                    "bytecode" => FuncKind::Bytecode,
                    "compiled" => FuncKind::Compiled,
                    _ => return Err(err(format!("unknown function kind `{kind}`"))),
                };
                if f.kind != FuncKind::Packed {
                    f.num_args = f.param_names.len() as i64;
                }
                if f.kind == FuncKind::Bytecode {
                    bodies.push(Body { func: exec.funcs.len(), line: n, at, lines: Vec::new() });
                }
                exec.funcs.push(f);
            }
            _ => return Err(err(format!("cannot read `{line}`"))),
        }
    }
    // Lay the bodies out where they were.
    bodies.sort_by_key(|b| b.at);
    for Body { func: index, line, at, lines: body } in bodies {
        if at != exec.instr_offset.len() as i64 {
            return Err(AsmError {
                line,
                message: format!(
                    "function {} starts at {at}, but the code before it ends at {}",
                    exec.funcs[index].name,
                    exec.instr_offset.len()
                ),
            });
        }
        exec.funcs[index].start_instr = at;
        for (n, text) in body {
            let instr = parse_instr(&exec, &text).map_err(|message| AsmError { line: n, message })?;
            exec.instr_offset.push(exec.instr_data.len() as i64);
            instr.encode(&mut exec.instr_data);
        }
        exec.funcs[index].end_instr = exec.instr_offset.len() as i64;
    }
    Ok(exec)
}

fn parse_constant(body: &str) -> Option<Constant> {
    let (kind, rest) = body.split_once(' ').unwrap_or((body, ""));
    Some(match kind {
        "dtype" => Constant::DataType(parse_dtype(rest)?),
        "str" => Constant::Str(unquote(rest)?),
        "shape" => Constant::Shape(parse_ints(rest)?),
        "int" => Constant::Int(rest.parse().ok()?),
        "float" => Constant::Float(f64::from_bits(u64::from_str_radix(rest.strip_prefix("0x")?, 16).ok()?)),
        "tensor" => {
            let mut parts = rest.split(' ');
            let dtype = parse_dtype(parts.next()?)?;
            let shape = parse_ints(parts.next()?)?;
            let data = parse_hex(parts.next()?)?;
            Constant::Tensor(TensorConst { dtype, shape, data: data.into() })
        }
        _ => return None,
    })
}

fn reg(s: &str) -> Result<i64, String> {
    match s {
        "%void" => Ok(VOID_REG),
        "%vm" => Ok(VM_REG),
        _ => s.strip_prefix('%').and_then(|r| r.parse().ok()).ok_or_else(|| format!("bad register `{s}`")),
    }
}

fn parse_instr(exec: &Executable, text: &str) -> Result<Instr, String> {
    let func = |name: &str| exec.func_index(name).map(|i| i as i64).ok_or_else(|| format!("unknown function `{name}`"));
    if let Some(rest) = text.strip_prefix("ret") {
        return Ok(Instr::Ret { result: reg(rest.trim())? });
    }
    if let Some(rest) = text.strip_prefix("goto") {
        return Ok(Instr::Goto { offset: rest.trim().parse().map_err(|_| "bad goto offset".to_string())? });
    }
    if let Some(rest) = text.strip_prefix("If") {
        let (c, off) = rest.trim().split_once(", ").ok_or("bad If")?;
        return Ok(Instr::If { cond: reg(c)?, false_offset: off.parse().map_err(|_| "bad If offset".to_string())? });
    }
    let rest = text.strip_prefix("call").ok_or_else(|| format!("unknown instruction `{text}`"))?;
    let (name, rest) = rest.trim_start().split_once(" in:").ok_or("a call needs ` in:`")?;
    let (args, dst) = rest.rsplit_once("dst:").ok_or("a call needs `dst:`")?;
    let args = args
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            if a.starts_with('%') {
                reg(a).map(Arg::Reg)
            } else if let Some(v) = a.strip_prefix('i') {
                v.parse().map(Arg::Imm).map_err(|_| format!("bad immediate `{a}`"))
            } else if let Some(c) = a.strip_prefix("c[").and_then(|c| c.strip_suffix(']')) {
                c.parse().map(Arg::Const).map_err(|_| format!("bad constant `{a}`"))
            } else if let Some(f) = a.strip_prefix("f[").and_then(|f| f.strip_suffix(']')) {
                func(f).map(Arg::Func)
            } else {
                Err(format!("bad argument `{a}`"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Instr::Call { dst: reg(dst.trim())?, func: func(name.trim())?, args })
}
