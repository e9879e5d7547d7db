//! Which tensors compiled code can build on the native stack. An `alloc_tensor` whose result
//! only feeds kernels and read-only builtins and is killed in the same basic block, while the
//! storage register it views stays untouched, needs no object at all: its DLTensor is built in
//! the native frame and passed as a `DLTensor*`. That saves an allocation and three atomic
//! reference-count updates per operator.
//!
//! Where the program proves more, the tensor costs nothing at run time: when the storage
//! register holds, on every path, the Storage one `alloc_storage` made (the only instruction of
//! the function that writes it, in a function whose jumps all go forward) and that Storage is
//! big enough, no check is needed; and when the tensor's register is written by nothing else,
//! it need not hold the tensor at all: its uses read the stack slot directly (a "virtual"
//! register, None whenever anything else could look).
//!
//! A tensor object holds a reference to its Storage, so TVM's plans kill a storage register
//! right after its last `alloc_tensor`, while that tensor still lives: the Storage dies with the
//! tensor. A stack tensor holds no reference, so there the storage register's kill waits for the
//! tensor's (`Site::storage_kill`, [`deferred_kills`]): the Storage is freed at the same point as
//! in TVM, and each storage's last tensor (two of every chain's) needs no object either.

use std::collections::HashMap;

use crate::codegen::shim::find_builtin;
use crate::vm::{Arg, Constant, DType, Executable, FuncKind, Instr, VM_REG, VOID_REG};

/// A tensor view: what a stack tensor's DLTensor is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct View {
    pub storage: i64,
    pub offset: i64,
    /// Constant-pool indices of the shape and the dtype.
    pub shape: i64,
    pub dtype: i64,
}

/// One alloc_tensor built on the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// Chunk-relative pc of the null_value that kills the tensor.
    pub kill: usize,
    pub view: View,
    /// Bytes the view needs of its storage: offset plus the tensor's size.
    pub end: i64,
    /// The storage is proven big enough and the tensor's register is virtual: no run-time check,
    /// no register write.
    pub proven: bool,
    /// Chunk-relative pc of a `null_value` of the storage register while the tensor lives, which
    /// then waits for the tensor's kill; nothing reads or writes that register in between.
    pub storage_kill: Option<usize>,
}

/// Storage kills moved later by stack tensors (see the module's opening): the pcs whose kill
/// waits, and after which tensor kills each waiting storage register dies, by chunk-relative pc.
#[derive(Default)]
pub struct DeferredKills {
    pub waiting: std::collections::HashSet<usize>,
    pub after: HashMap<usize, Vec<i64>>,
}

/// Each deferred storage kill happens after the last kill of the stack tensors that view it.
pub fn deferred_kills<'a>(sites: impl IntoIterator<Item = &'a Site>) -> DeferredKills {
    let mut last: HashMap<usize, (usize, i64)> = HashMap::new(); // storage kill -> (tensor kill, storage)
    for site in sites {
        if let Some(at) = site.storage_kill {
            let entry = last.entry(at).or_insert((site.kill, site.view.storage));
            entry.0 = entry.0.max(site.kill);
        }
    }
    let mut deferred = DeferredKills::default();
    for (at, (kill, storage)) in last {
        deferred.waiting.insert(at);
        deferred.after.entry(kill).or_default().push(storage);
    }
    deferred.after.values_mut().for_each(|v| v.sort_unstable());
    deferred
}

/// The tensor's byte size if `vm.builtin.alloc_tensor` accepts this shape and dtype (the same
/// rules as the builtin: a supported dtype, no negative dims, no overflow); it can then fail
/// only on the storage.
pub fn tensor_bytes(dims: &[i64], dtype: DType) -> Option<i64> {
    let bits = dtype.bits as i64;
    let pow2 = bits != 0 && bits & (bits - 1) == 0;
    let sized = bits % 8 == 0 || (dtype.code == 1 && bits == 1) || dtype.code == 6;
    if dtype.lanes < 1 || !sized || !pow2 {
        return None;
    }
    let count = dims.iter().try_fold(1i64, |a, &d| if d < 0 { None } else { a.checked_mul(d) })?;
    count.checked_mul(64)?;
    Some(count.checked_mul(bits)?.checked_mul(dtype.lanes as i64)?.checked_add(7)? / 8)
}

/// What holds for a whole Relax function, from its instructions (function-relative pcs).
pub struct FunctionFacts {
    /// Registers only `alloc_storage` with a constant size writes (kills aside), with the pc of
    /// that instruction, the Storage's size, and whether it runs before any branch.
    storages: HashMap<i64, (usize, i64, bool)>,
    /// Each register's writers other than `null_value` kills.
    writers: HashMap<i64, Vec<usize>>,
    /// The pcs of `null_value` kills of each register.
    kills: HashMap<i64, Vec<usize>>,
    /// The basic block of each instruction (blocks numbered in order).
    block: Vec<usize>,
    /// Every jump goes forward, so execution visits pcs in increasing order.
    forward_only: bool,
    num_args: i64,
}

impl FunctionFacts {
    pub fn of(exec: &Executable, instrs: &[Instr], num_args: i64) -> FunctionFacts {
        let mut facts = FunctionFacts {
            storages: HashMap::new(),
            writers: HashMap::new(),
            kills: HashMap::new(),
            block: super::plan::leaders(instrs)
                .0
                .iter()
                .scan(0, |n, &l| {
                    *n += l as usize;
                    Some(*n)
                })
                .collect(),
            forward_only: true,
            num_args,
        };
        let first_branch = instrs.iter().position(|i| !matches!(i, Instr::Call { .. })).unwrap_or(instrs.len());
        let mut alloc_storage = Vec::new();
        for (pc, ins) in instrs.iter().enumerate() {
            match ins {
                Instr::Goto { offset } | Instr::If { false_offset: offset, .. } if *offset <= 0 => {
                    facts.forward_only = false;
                }
                Instr::Call { dst, func, args } if *dst < VOID_REG => {
                    let name = exec.funcs[*func as usize].name.as_str();
                    if name == "vm.builtin.null_value" && args.is_empty() {
                        facts.kills.entry(*dst).or_default().push(pc);
                        continue;
                    }
                    facts.writers.entry(*dst).or_default().push(pc);
                    if name == "vm.builtin.alloc_storage"
                        && let [Arg::Reg(VM_REG), Arg::Const(size), ..] = args.as_slice()
                        && let Constant::Shape(dims) = &exec.constants[*size as usize]
                        && let Some(nbytes) = dims.iter().try_fold(1i64, |a, &d| (d >= 0).then(|| a.checked_mul(d))?)
                    {
                        alloc_storage.push((*dst, pc, nbytes, pc < first_branch));
                    }
                }
                _ => {}
            }
        }
        for (reg, pc, nbytes, unconditional) in alloc_storage {
            if reg >= num_args && facts.writers[&reg].len() == 1 {
                facts.storages.insert(reg, (pc, nbytes, unconditional));
            }
        }
        facts
    }

    /// Register `s` holds a Storage of at least `end` bytes when instruction `pc` runs.
    fn storage_proven(&self, s: i64, pc: usize, end: i64) -> bool {
        let Some(&(def, nbytes, unconditional)) = self.storages.get(&s) else { return false };
        let same_block = def < pc && self.block[def] == self.block[pc];
        let killed_between = self.kills.get(&s).is_some_and(|k| k.iter().any(|&k| def < k && k < pc));
        self.forward_only && def < pc && (unconditional || same_block) && !killed_between && nbytes >= end
    }

    /// Register `t` is written by the instruction at `pc` alone (and killed), so it can stay
    /// virtual.
    fn sole_writer(&self, t: i64, pc: usize) -> bool {
        self.forward_only && t >= self.num_args && self.writers.get(&t).is_some_and(|w| w == &[pc])
    }
}

/// The alloc_tensor instructions of instructions `[lo, lo + instrs.len())` of a function whose
/// tensors can live on the stack, by chunk-relative pc. `leader[i]` says chunk instruction i
/// starts a block.
pub fn sites(
    exec: &Executable,
    symbols: &[Option<String>],
    facts: &FunctionFacts,
    instrs: &[Instr],
    lo: usize,
    leader: &[bool],
) -> HashMap<usize, Site> {
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
        let (t, view, end) = match args.as_slice() {
            [Arg::Reg(s), Arg::Imm(offset), Arg::Const(shape), Arg::Const(dtype)]
                if name(*func) == "vm.builtin.alloc_tensor"
                    && *offset >= 0
                    && *s < VOID_REG
                    && *t < VOID_REG
                    && t != s =>
            {
                let (Constant::Shape(dims), Constant::DataType(d)) =
                    (&exec.constants[*shape as usize], &exec.constants[*dtype as usize])
                else {
                    continue;
                };
                let Some(end) = tensor_bytes(dims, *d).and_then(|n| n.checked_add(*offset)) else { continue };
                (*t, View { storage: *s, offset: *offset, shape: *shape, dtype: *dtype }, end)
            }
            _ => continue,
        };
        let mut kill = None;
        let mut storage_kill = None;
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
                    if storage_kill.is_some() && (*dst == view.storage || args.contains(&Arg::Reg(view.storage))) {
                        break; // it would see the Storage where TVM's register holds None
                    }
                    if *dst == view.storage {
                        if args.is_empty() && name(*func) == "vm.builtin.null_value" {
                            storage_kill = Some(j);
                            continue;
                        }
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
        if let Some(kill) = kill {
            let proven = facts.storage_proven(view.storage, lo + i, end) && facts.sole_writer(t, lo + i);
            sites.insert(i, Site { kill, view, end, proven, storage_kill });
        }
    }
    sites
}

/// Gives each stack-tensor site a slot, reusing slots whose tensor is dead: the live ranges are
/// [site, kill], so straight-line code needs only as many slots as tensors alive at once. A free
/// slot that last held the same view is preferred: its DLTensor need not be written again.
pub fn assign_slots(sites: &HashMap<usize, Site>) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, Site)> = sites.iter().map(|(&s, site)| (s, *site)).collect();
    ranges.sort_unstable_by_key(|(s, _)| *s);
    let mut busy: Vec<(usize, usize)> = Vec::new(); // (kill, slot)
    let mut free: Vec<usize> = Vec::new();
    let mut last_view: Vec<View> = Vec::new(); // per slot
    let mut out = Vec::with_capacity(ranges.len());
    for (site, s) in ranges {
        busy.retain(|&(k, slot)| {
            let live = k >= site;
            if !live {
                free.push(slot);
            }
            live
        });
        let reuse = free.iter().position(|&slot| last_view[slot] == s.view).or((!free.is_empty()).then_some(0));
        let slot = match reuse {
            Some(at) => free.swap_remove(at),
            None => {
                last_view.push(s.view);
                last_view.len() - 1
            }
        };
        last_view[slot] = s.view;
        busy.push((s.kill, slot));
        out.push((site, slot));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(kill: usize, storage: i64) -> Site {
        Site { kill, view: View { storage, offset: 0, shape: 0, dtype: 1 }, end: 4, proven: true, storage_kill: None }
    }

    #[test]
    fn a_storage_kill_waits_for_the_last_stack_tensor_viewing_it() {
        let waiting = |kill, storage, at| Site { storage_kill: Some(at), ..site(kill, storage) };
        let sites = [waiting(9, 1, 5), waiting(7, 1, 5), waiting(8, 3, 6), site(4, 1)];
        let deferred = deferred_kills(&sites);
        assert_eq!(deferred.waiting, [5, 6].into_iter().collect());
        assert_eq!(deferred.after, [(9, vec![1]), (8, vec![3])].into_iter().collect());
    }

    #[test]
    fn dead_slots_are_reused_preferring_the_same_view() {
        // Two tensors alive at a time, alternating between two storages (the chain pattern).
        let sites = [(0, site(2, 1)), (1, site(3, 3)), (4, site(6, 1)), (5, site(9, 3))].into_iter().collect();
        let slots = assign_slots(&sites);
        assert_eq!(slots, [(0, 0), (1, 1), (4, 0), (5, 1)]);
    }

    #[test]
    fn tensor_bytes_follows_the_builtin() {
        let f32 = DType::F32;
        assert_eq!(tensor_bytes(&[2, 3], f32), Some(24));
        assert_eq!(tensor_bytes(&[], f32), Some(4));
        assert_eq!(tensor_bytes(&[-1], f32), None);
        assert_eq!(tensor_bytes(&[1 << 40, 1 << 40], f32), None);
        assert_eq!(tensor_bytes(&[3], DType::new(1, 1, 1)), Some(1)); // uint1: 3 bits round up
        assert_eq!(tensor_bytes(&[4], DType::new(2, 12, 1)), None); // 12-bit floats are refused
    }
}
