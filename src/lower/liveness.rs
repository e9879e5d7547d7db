//! Where each variable is used last (so lowering can kill it right after, as TVM's
//! KillAfterLastUse does), and which tensors may share storage: those used only as inputs of
//! DPS kernels, which read them and never keep them.

use std::collections::{HashMap, HashSet};

use crate::ir::{Atom, Block, Op, VarId};

/// The operands an operation names directly (for `if`, only its condition).
pub(super) fn operands(op: &Op) -> Vec<&Atom> {
    match op {
        Op::DpsPacked { args, .. } | Op::Packed { args, .. } | Op::CallFunc { args, .. } | Op::Tuple(args) => {
            args.iter().collect()
        }
        Op::CallClosure { callee, args } => std::iter::once(callee).chain(args).collect(),
        Op::GetItem(a, _) | Op::Copy(a) | Op::MatchCast(a, _) => vec![a],
        Op::If { cond, .. } => vec![cond],
        Op::MakeClosure { .. } => Vec::new(),
    }
}

/// Every operand an operation reads, inside `if` branches too.
fn atoms_of(op: &Op) -> Vec<&Atom> {
    let mut v = operands(op);
    if let Op::If { then, otherwise, .. } = op {
        for b in [then, otherwise] {
            v.extend(b.bindings.iter().flat_map(|x| atoms_of(&x.op)));
            v.push(&b.result);
        }
    }
    v
}

/// Variables an operation reads (closure captures included).
pub fn uses(op: &Op) -> Vec<VarId> {
    let mut out: Vec<VarId> =
        atoms_of(op).into_iter().filter_map(|a| if let Atom::Var(v) = a { Some(*v) } else { None }).collect();
    match op {
        Op::MakeClosure { captures, .. } => out.extend(captures),
        Op::If { then, otherwise, .. } => {
            for b in [then, otherwise] {
                for x in &b.bindings {
                    if let Op::MakeClosure { captures, .. } = &x.op {
                        out.extend(captures);
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// For each binding index of the block, the variables whose last use it is.
pub fn last_uses(block: &Block) -> HashMap<usize, Vec<VarId>> {
    let mut last: HashMap<VarId, usize> = HashMap::new();
    for (i, b) in block.bindings.iter().enumerate() {
        for v in uses(&b.op) {
            last.insert(v, i);
        }
    }
    let mut out: HashMap<usize, Vec<VarId>> = HashMap::new();
    for (v, i) in last {
        if block.result != Atom::Var(v) {
            out.entry(i).or_default().push(v);
        }
    }
    for vs in out.values_mut() {
        vs.sort_unstable();
    }
    out
}

/// Variables that only ever feed DPS kernels as inputs (never returned, stored, copied or passed
/// anywhere that could keep them): their storage can be reused after their last use.
pub fn kernel_only(block: &Block) -> HashSet<VarId> {
    let mut ok = HashSet::new();
    let mut bad = HashSet::new();
    fn walk(block: &Block, ok: &mut HashSet<VarId>, bad: &mut HashSet<VarId>) {
        for b in &block.bindings {
            match &b.op {
                Op::DpsPacked { args, .. } => {
                    for a in args {
                        if let Atom::Var(v) = a {
                            ok.insert(*v);
                        }
                    }
                }
                Op::If { then, otherwise, .. } => {
                    for v in uses(&b.op) {
                        bad.insert(v);
                    }
                    walk(then, ok, bad);
                    walk(otherwise, ok, bad);
                }
                other => {
                    for v in uses(other) {
                        bad.insert(v);
                    }
                }
            }
        }
        if let Atom::Var(v) = &block.result {
            bad.insert(*v);
        }
    }
    walk(block, &mut ok, &mut bad);
    ok.retain(|v| !bad.contains(v));
    ok
}
