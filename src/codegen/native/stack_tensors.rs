//! Which tensors compiled code can build on the native stack. An `alloc_tensor` whose result
//! only feeds kernels and read-only builtins and is killed in the same basic block, while the
//! storage register it views stays untouched, needs no object at all: its DLTensor is built in
//! the native frame and passed as a `DLTensor*`. That saves an allocation and three atomic
//! reference-count updates per operator.

use std::collections::HashMap;

use crate::codegen::shim::find_builtin;
use crate::vm::{Arg, Constant, Executable, FuncKind, Instr, VOID_REG};

/// The alloc_tensor instructions (by chunk-relative pc) whose tensors can live on the stack,
/// with the pc of the null_value that kills each. `leader[i]` says instruction i starts a block.
pub fn sites(
    exec: &Executable,
    symbols: &[Option<String>],
    instrs: &[Instr],
    leader: &[bool],
) -> HashMap<usize, usize> {
    let name = |f: i64| exec.funcs[f as usize].name.as_str();
    let is_kernel = |f: i64| {
        let info = &exec.funcs[f as usize];
        info.kind == FuncKind::Packed && symbols[f as usize].is_some() && find_builtin(&info.name).is_none()
    };
    let read_only = |f: i64| find_builtin(name(f)).is_some_and(|b| b.read_only);
    let mut sites = HashMap::new();
    for (i, ins) in instrs.iter().enumerate() {
        let Instr::Call { dst: t, func, args } = ins else {
            continue;
        };
        let (t, s) = match args.as_slice() {
            [Arg::Reg(s), Arg::Imm(off), Arg::Const(shape), Arg::Const(dtype)]
                if name(*func) == "vm.builtin.alloc_tensor"
                    && *off >= 0
                    && *s < VOID_REG
                    && *t < VOID_REG
                    && t != s
                    && matches!(exec.constants[*shape as usize], Constant::Shape(_))
                    && matches!(exec.constants[*dtype as usize], Constant::DataType(_)) =>
            {
                (*t, *s)
            }
            _ => continue,
        };
        let mut kill = None;
        for (j, next) in instrs.iter().enumerate().skip(i + 1) {
            if leader[j] {
                break; // the tensor must die in its own block
            }
            match next {
                Instr::Call { dst, func, args } => {
                    let uses_t = args.contains(&Arg::Reg(t));
                    if uses_t && !(is_kernel(*func) || read_only(*func)) {
                        break;
                    }
                    if *dst == s {
                        break; // the storage could be released while the tensor lives
                    }
                    if *dst == t {
                        let is_kill = !uses_t && args.is_empty() && name(*func) == "vm.builtin.null_value";
                        kill = is_kill.then_some(j);
                        break;
                    }
                }
                _ => break, // Ret, Goto and If end the block
            }
        }
        if let Some(k) = kill {
            sites.insert(i, k);
        }
    }
    sites
}

/// Gives each stack-tensor site a slot, reusing slots whose tensor is dead: the live ranges are
/// [site, kill], so straight-line code needs only as many slots as tensors alive at once.
pub fn assign_slots(sites: &HashMap<usize, usize>) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = sites.iter().map(|(&s, &k)| (s, k)).collect();
    ranges.sort_unstable();
    let mut busy: Vec<(usize, usize)> = Vec::new(); // (kill, slot)
    let mut free: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut out = Vec::with_capacity(ranges.len());
    for (site, kill) in ranges {
        busy.retain(|&(k, slot)| {
            let live = k >= site;
            if !live {
                free.push(slot);
            }
            live
        });
        let slot = free.pop().unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        busy.push((kill, slot));
        out.push((site, slot));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn dead_slots_are_reused() {
        let sites = [(0, 2), (1, 3), (4, 6), (5, 9)].into_iter().collect();
        let slots = super::assign_slots(&sites);
        assert_eq!(slots, [(0, 0), (1, 1), (4, 1), (5, 0)]);
    }
}
