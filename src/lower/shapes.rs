//! The shape heap of one function: a slot for every symbolic variable and for every compound
//! shape expression, and the shape functions that compute compound slots once the variables they
//! read are known (after parameter matching, and after each match_cast that binds new ones).

use std::collections::{BTreeMap, BTreeSet};

use crate::ir::{PrimExpr, ShapeFunc, SlotExpr};

#[derive(Default)]
pub struct ShapeHeap {
    /// Variable or compound expression -> slot.
    slots: BTreeMap<PrimExpr, usize>,
    /// Variables whose value is in the heap (bound by a match).
    pub bound: BTreeSet<String>,
    /// Compound slots already computed.
    computed: BTreeSet<usize>,
    pub functions: Vec<ShapeFunc>,
}

/// How a dim is read at run time.
pub enum Dim {
    Imm,
    Slot(usize),
}

impl ShapeHeap {
    pub fn size(&self) -> usize {
        self.slots.len()
    }

    pub fn slot(&mut self, e: &PrimExpr) -> usize {
        let n = self.slots.len();
        *self.slots.entry(e.clone()).or_insert(n)
    }

    /// Registers every compound sub-expression of e (so slots are stable before code is emitted).
    pub fn intern(&mut self, e: &PrimExpr) {
        if e.as_int().is_some() {
            return;
        }
        if let PrimExpr::Bin(_, a, b) = e {
            self.intern(a);
            self.intern(b);
        }
        self.slot(e);
    }

    /// Whether every variable of e is bound.
    pub fn known(&self, e: &PrimExpr) -> bool {
        let mut vars = BTreeSet::new();
        e.vars(&mut vars);
        vars.iter().all(|v| self.bound.contains(v))
    }

    /// Where a dim's value is at run time (its slot computed already, or an immediate).
    pub fn dim(&self, e: &PrimExpr) -> Option<Dim> {
        if e.as_int().is_some() {
            return Some(Dim::Imm);
        }
        let slot = *self.slots.get(e)?;
        let ready = match e {
            PrimExpr::Var(v) => self.bound.contains(v),
            _ => self.computed.contains(&slot),
        };
        ready.then_some(Dim::Slot(slot))
    }

    /// A shape function computing every compound slot that became computable, if there is any.
    pub fn new_shape_function(&mut self, name: &str) -> Option<String> {
        let mut ready: Vec<(usize, PrimExpr)> = self
            .slots
            .iter()
            .filter(|(e, slot)| matches!(e, PrimExpr::Bin(..)) && !self.computed.contains(slot) && self.known(e))
            .map(|(e, slot)| (*slot, e.clone()))
            .collect();
        if ready.is_empty() {
            return None;
        }
        // Sub-expressions have lower slots only if interned first; order by size to be safe.
        ready.sort_by_key(|(_, e)| depth(e));
        let assignments = ready.iter().map(|(slot, e)| (*slot, self.in_slots(e))).collect();
        for (slot, _) in &ready {
            self.computed.insert(*slot);
        }
        let name = format!("{name}{}", self.functions.len());
        self.functions.push(ShapeFunc { name: name.clone(), assignments });
        Some(name)
    }

    /// e over heap slots: variables become reads of their slots.
    fn in_slots(&self, e: &PrimExpr) -> SlotExpr {
        match e {
            PrimExpr::Int(v) => SlotExpr::Int(*v),
            PrimExpr::Var(_) => SlotExpr::Slot(self.slots[e]),
            PrimExpr::Bin(op, a, b) => SlotExpr::Bin(*op, Box::new(self.in_slots(a)), Box::new(self.in_slots(b))),
        }
    }
}

fn depth(e: &PrimExpr) -> usize {
    match e {
        PrimExpr::Bin(_, a, b) => 1 + depth(a).max(depth(b)),
        _ => 0,
    }
}
