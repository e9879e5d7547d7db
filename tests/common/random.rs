//! Random valid Relax VM programs over the test kernels in tests/kernels/random_kernels.c:
//! straight-line tensor code, If diamonds, bounded loops, calls between functions, closures,
//! tuples, shapes, copies and kills, long chains of one repeated step (which compiled mode rolls
//! into loops), and now and then a deliberate run-time error. Many programs
//! go into one executable (`p<i>_main`, with helpers `p<i>_h<k>` and closures `p<i>_c`), so one
//! link serves thousands of them.

use relaxc::vm::{Arg, Constant, DType, ExecBuilder, Executable, Instr, VM_REG, VOID_REG};

/// xorshift64*: a small, fixed, dependency-free generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }
}

/// How many mutated inputs a bounded fuzz test tries: `RELAXC_FUZZ_COUNT`, else `default`.
pub fn fuzz_count(default: usize) -> usize {
    std::env::var("RELAXC_FUZZ_COUNT").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// `source` after one to three random edits: a byte removed, a snippet inserted, or a byte
/// overwritten from `alphabet`. Text-level mutation for the front ends' bounded fuzz tests.
pub fn mutate_text(rng: &mut Rng, source: &str, snippets: &[&str], alphabet: &[u8]) -> String {
    let mut s = source.as_bytes().to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(s.len() + 1);
        match rng.below(3) {
            0 if at < s.len() => {
                s.remove(at);
            }
            1 => {
                let snip = snippets[rng.below(snippets.len())].as_bytes();
                s.splice(at..at, snip.iter().copied());
            }
            _ if at < s.len() => s[at] = alphabet[rng.below(alphabet.len())],
            _ => {}
        }
    }
    String::from_utf8_lossy(&s).into_owned()
}

/// Interned constants and function indices every program shares.
struct Shared {
    f32: i64,
    u8: i64,
    global: i64,
    shape4: i64,
    bytes16: i64,
    ctx: i64,
    alloc_storage: i64,
    alloc_tensor: i64,
    null_value: i64,
    copy: i64,
    make_tuple: i64,
    tuple_getitem: i64,
    shape_of: i64,
    read_if_cond: i64,
    make_closure: i64,
    invoke_closure: i64,
    check_tensor_info: i64,
    match_shape: i64,
    rk: [i64; 8], // add, mul, scale, fill, positive, dec, gt0, below
}

const ADD: usize = 0;
const MUL: usize = 1;
const SCALE: usize = 2;
const FILL: usize = 3;
const POSITIVE: usize = 4;
const DEC: usize = 5;
const GT0: usize = 6;
const BELOW: usize = 7;

/// A batch of programs in one executable; main functions take (x: float32[4], k: int).
pub struct Batch {
    pub exec: Executable,
    pub mains: Vec<String>,
}

pub fn generate(seed: u64, count: usize) -> Batch {
    let mut b = ExecBuilder::new();
    let ctx = "ErrorContext(fn=main, loc=param[0], param=x, annotation=R.Tensor((4,), dtype=\"float32\")) ";
    let shared = Shared {
        f32: b.constant(Constant::DataType(DType::F32)),
        u8: b.constant(Constant::DataType(DType::U8)),
        global: b.constant(Constant::Str("global".into())),
        shape4: b.constant(Constant::Shape(vec![4])),
        bytes16: b.constant(Constant::Shape(vec![16])),
        ctx: b.constant(Constant::Str(ctx.into())),
        alloc_storage: b.packed("vm.builtin.alloc_storage"),
        alloc_tensor: b.packed("vm.builtin.alloc_tensor"),
        null_value: b.packed("vm.builtin.null_value"),
        copy: b.packed("vm.builtin.copy"),
        make_tuple: b.packed("vm.builtin.make_tuple"),
        tuple_getitem: b.packed("vm.builtin.tuple_getitem"),
        shape_of: b.packed("vm.builtin.shape_of"),
        read_if_cond: b.packed("vm.builtin.read_if_cond"),
        make_closure: b.packed("vm.builtin.make_closure"),
        invoke_closure: b.packed("vm.builtin.invoke_closure"),
        check_tensor_info: b.packed("vm.builtin.check_tensor_info"),
        match_shape: b.packed("vm.builtin.match_shape"),
        rk: ["rk_add", "rk_mul", "rk_scale", "rk_fill", "rk_positive", "rk_dec", "rk_gt0", "rk_below"]
            .map(|k| b.packed(k)),
    };
    let mut rng = Rng::new(seed);
    let mut mains = Vec::new();
    for p in 0..count {
        let mut helpers = Vec::new();
        for h in 0..rng.below(3) {
            let name = format!("p{p}_h{h}");
            let index = b.begin_function(&name, &["a"]);
            let mut g = Gen::new(&mut b, &mut rng, &shared, &helpers, None, 1);
            g.tensors.push(0);
            g.checks(0);
            let n = 1 + g.rng.below(3);
            for _ in 0..n {
                g.tensor_op(true);
            }
            let result = *g.tensors.last().expect("a tensor");
            g.ret(result);
            helpers.push(index);
        }
        let closure = if rng.chance(40) {
            let index = b.begin_function(&format!("p{p}_c"), &["a", "captured"]);
            let mut g = Gen::new(&mut b, &mut rng, &shared, &[], None, 2);
            g.tensors.extend([0, 1]);
            let t = g.tensor_op(true);
            g.ret(t);
            Some(index)
        } else {
            None
        };
        let name = format!("p{p}_main");
        b.begin_function(&name, &["x", "k"]);
        let mut g = Gen::new(&mut b, &mut rng, &shared, &helpers, closure, 2);
        g.tensors.push(0);
        g.ints.push(1);
        g.checks(0);
        let steps = 4 + g.rng.below(14);
        let fail_at = g.rng.chance(4).then(|| g.rng.below(steps));
        for step in 0..steps {
            if fail_at == Some(step) {
                g.failure();
            }
            g.statement();
        }
        g.finish();
        mains.push(name);
    }
    Batch { exec: b.build(), mains }
}

struct Gen<'a> {
    b: &'a mut ExecBuilder,
    rng: &'a mut Rng,
    s: &'a Shared,
    helpers: &'a [i64],
    closure: Option<i64>,
    next_reg: i64,
    tensors: Vec<i64>,
    ints: Vec<i64>,
    storages: Vec<i64>,
    tuples: Vec<(i64, usize)>,
    others: Vec<i64>,
}

impl<'a> Gen<'a> {
    fn new(
        b: &'a mut ExecBuilder,
        rng: &'a mut Rng,
        s: &'a Shared,
        helpers: &'a [i64],
        closure: Option<i64>,
        params: i64,
    ) -> Gen<'a> {
        Gen {
            b,
            rng,
            s,
            helpers,
            closure,
            next_reg: params,
            tensors: Vec::new(),
            ints: Vec::new(),
            storages: Vec::new(),
            tuples: Vec::new(),
            others: Vec::new(),
        }
    }

    fn reg(&mut self) -> i64 {
        self.next_reg += 1;
        self.next_reg - 1
    }

    fn call(&mut self, dst: i64, func: i64, args: Vec<Arg>) {
        self.b.call(dst, func, args);
    }

    fn checks(&mut self, param: i64) {
        let s = self.s;
        self.call(
            VOID_REG,
            s.check_tensor_info,
            vec![Arg::Reg(param), Arg::Imm(1), Arg::Const(s.f32), Arg::Const(s.ctx)],
        );
        let shape = vec![Arg::Reg(param), Arg::Reg(VOID_REG), Arg::Imm(1), Arg::Imm(0), Arg::Imm(4), Arg::Const(s.ctx)];
        self.call(VOID_REG, s.match_shape, shape);
    }

    fn int_arg(&mut self) -> Arg {
        match self.rng.pick(&self.ints) {
            Some(r) if self.rng.chance(50) => Arg::Reg(r),
            _ => Arg::Imm(self.rng.below(7) as i64 - 3),
        }
    }

    /// A new 16-byte storage, in a new register.
    fn new_storage(&mut self) -> i64 {
        let s = self.s;
        let r = self.reg();
        let args = vec![Arg::Reg(VM_REG), Arg::Const(s.bytes16), Arg::Imm(0), Arg::Const(s.u8), Arg::Const(s.global)];
        self.call(r, s.alloc_storage, args);
        r
    }

    /// A float32[4] tensor allocated in a kept storage (half the time, outside `local` code) or a
    /// new 16-byte one: (tensor, storage, whether the storage is a kept one).
    fn alloc_float4(&mut self, local: bool) -> (i64, i64, bool) {
        let s = self.s;
        let kept = !local && !self.storages.is_empty() && self.rng.chance(50);
        let storage = if kept { self.rng.pick(&self.storages).expect("a storage") } else { self.new_storage() };
        let t = self.reg();
        self.call(t, s.alloc_tensor, vec![Arg::Reg(storage), Arg::Imm(0), Arg::Const(s.shape4), Arg::Const(s.f32)]);
        (t, storage, kept)
    }

    /// A new float32[4] tensor, not yet written: in a kept storage, or in a fresh one that is
    /// killed at once or kept. `local` code (inside a branch or a loop) keeps no storage alive,
    /// so the outer code's view of live values stays true.
    fn fresh_tensor(&mut self, local: bool) -> i64 {
        let s = self.s;
        let (t, storage, kept) = self.alloc_float4(local);
        if !kept {
            if local || self.rng.chance(60) {
                self.call(storage, s.null_value, vec![]);
            } else {
                self.storages.push(storage);
            }
        }
        t
    }

    /// A new float32[4] tensor computed by a kernel.
    fn tensor_op(&mut self, local: bool) -> i64 {
        let s = self.s;
        let t = self.fresh_tensor(local);
        let a = self.rng.pick(&self.tensors);
        let b = self.rng.pick(&self.tensors);
        match (self.rng.below(4), a, b) {
            (ADD, Some(a), Some(b)) => self.call(VOID_REG, s.rk[ADD], vec![Arg::Reg(a), Arg::Reg(b), Arg::Reg(t)]),
            (MUL, Some(a), Some(b)) => self.call(VOID_REG, s.rk[MUL], vec![Arg::Reg(a), Arg::Reg(b), Arg::Reg(t)]),
            (SCALE, Some(a), _) => {
                let k = self.int_arg();
                self.call(VOID_REG, s.rk[SCALE], vec![Arg::Reg(a), k, Arg::Reg(t)]);
            }
            _ => {
                let v = self.int_arg();
                self.call(VOID_REG, s.rk[FILL], vec![Arg::Reg(t), v]);
            }
        }
        self.tensors.push(t);
        t
    }

    /// A tensor that lives for two kernel calls and dies (the pattern compiled mode builds on
    /// the native stack): filled, added to a live tensor into a new one, killed. Its storage is a
    /// kept one (written once, perhaps long before), or a fresh one killed after the tensor, or
    /// killed while the tensor still lives (TVM's pattern for a storage's last tensor: compiled
    /// mode's kill then waits for the tensor's, `stack_tensors::deferred_kills`). Nothing but
    /// the new tensor is written: parameters are the caller's.
    fn temp_op(&mut self, local: bool) {
        let s = self.s;
        let Some(input) = self.rng.pick(&self.tensors) else { return };
        let (t, storage, kept) = self.alloc_float4(local);
        let early_kill = !kept && self.rng.chance(30);
        if early_kill {
            self.call(storage, s.null_value, vec![]);
        }
        let v = self.int_arg();
        self.call(VOID_REG, s.rk[FILL], vec![Arg::Reg(t), v]);
        let out = self.fresh_tensor(local);
        self.call(VOID_REG, s.rk[ADD], vec![Arg::Reg(t), Arg::Reg(input), Arg::Reg(out)]);
        self.call(t, s.null_value, vec![]);
        if !kept && !early_kill {
            self.call(storage, s.null_value, vec![]);
        }
        self.tensors.push(out);
    }

    fn int_op(&mut self) {
        let s = self.s;
        let r = self.reg();
        match (self.rng.below(3), self.rng.pick(&self.ints), self.rng.pick(&self.tensors)) {
            (0, Some(i), _) => self.call(r, s.rk[DEC], vec![Arg::Reg(i)]),
            (1, _, Some(t)) => self.call(r, s.rk[POSITIVE], vec![Arg::Reg(t)]),
            _ => {
                let v = self.rng.below(9) as i64 - 4;
                self.call(r, s.copy, vec![Arg::Imm(v)]);
            }
        }
        self.ints.push(r);
    }

    fn any_value(&mut self) -> Option<i64> {
        let all: Vec<i64> = self.tensors.iter().chain(&self.ints).chain(&self.others).copied().collect();
        self.rng.pick(&all)
    }

    fn statement(&mut self) {
        let s = self.s;
        match self.rng.below(100) {
            0..=24 => {
                self.tensor_op(false);
            }
            25..=34 => self.temp_op(false),
            35..=44 => self.int_op(),
            45..=51 => {
                let n = self.rng.below(4);
                let items: Vec<Arg> = (0..n).filter_map(|_| self.any_value()).map(Arg::Reg).collect();
                let r = self.reg();
                let len = items.len();
                self.call(r, s.make_tuple, items);
                self.tuples.push((r, len));
                self.others.push(r);
            }
            52..=56 => {
                if let Some((tup, len)) = self.rng.pick(&self.tuples).filter(|(_, len)| *len > 0) {
                    let r = self.reg();
                    let i = self.rng.below(len) as i64;
                    self.call(r, s.tuple_getitem, vec![Arg::Reg(tup), Arg::Imm(i)]);
                    self.others.push(r);
                }
            }
            57..=59 => {
                if let Some(t) = self.rng.pick(&self.tensors) {
                    let r = self.reg();
                    self.call(r, s.shape_of, vec![Arg::Reg(t)]);
                    self.others.push(r);
                }
            }
            60..=64 => {
                if let Some(t) = self.rng.pick(&self.tensors) {
                    let r = self.reg();
                    self.call(r, s.copy, vec![Arg::Reg(t)]);
                    self.tensors.push(r);
                }
            }
            65..=72 => self.kill(),
            73..=78 => {
                if let (Some(h), Some(t)) = (self.rng.pick(self.helpers), self.rng.pick(&self.tensors)) {
                    let r = self.reg();
                    self.call(r, h, vec![Arg::Reg(t)]);
                    self.tensors.push(r);
                }
            }
            79..=84 => self.closure_call(),
            85..=92 => self.diamond(),
            93..=96 => self.bounded_loop(),
            _ => self.repeated(),
        }
    }

    fn kill(&mut self) {
        let lists: [&mut Vec<i64>; 4] = [&mut self.tensors, &mut self.ints, &mut self.others, &mut self.storages];
        let which = (self.rng.next() % 4) as usize;
        let list = lists.into_iter().nth(which).expect("list");
        if list.len() > 1 {
            let i = (self.rng.next() % list.len() as u64) as usize;
            let r = list.remove(i);
            self.tuples.retain(|(t, _)| *t != r);
            self.b.call(r, self.s.null_value, vec![]);
        }
    }

    fn closure_call(&mut self) {
        let s = self.s;
        let (Some(f), Some(cap), Some(arg)) =
            (self.closure, self.rng.pick(&self.tensors), self.rng.pick(&self.tensors))
        else {
            return;
        };
        let clo = self.reg();
        self.call(clo, s.make_closure, vec![Arg::Func(f), Arg::Reg(cap)]);
        let r = self.reg();
        self.call(r, s.invoke_closure, vec![Arg::Reg(VM_REG), Arg::Reg(clo), Arg::Reg(arg)]);
        self.tensors.push(r);
        if self.rng.chance(50) {
            self.call(clo, s.null_value, vec![]);
        } else {
            self.others.push(clo);
        }
    }

    /// if c { merge = f(..) } else { merge = g(..) }: only `merge` is live after the join.
    fn diamond(&mut self) {
        let s = self.s;
        let cond_src = match self.rng.pick(&self.ints) {
            Some(i) => i,
            None => return,
        };
        let (c, merge) = (self.reg(), self.reg());
        self.call(c, s.read_if_cond, vec![Arg::Reg(cond_src)]);
        let if_pc = self.b.next_pc();
        self.b.emit(Instr::If { cond: c, false_offset: 0 });
        let saved = (self.tensors.clone(), self.ints.clone());
        for _ in 0..1 + self.rng.below(2) {
            self.tensor_op(true);
        }
        if self.rng.chance(50) {
            self.temp_op(true);
        }
        let then_value = *self.tensors.last().expect("a tensor");
        self.call(merge, s.copy, vec![Arg::Reg(then_value)]);
        let goto_pc = self.b.next_pc();
        self.b.emit(Instr::Goto { offset: 0 });
        (self.tensors, self.ints) = saved.clone();
        let else_pc = self.b.next_pc();
        self.b.patch_offset(if_pc, else_pc - if_pc);
        for _ in 0..1 + self.rng.below(2) {
            self.tensor_op(true);
        }
        let else_value = *self.tensors.last().expect("a tensor");
        self.call(merge, s.copy, vec![Arg::Reg(else_value)]);
        let join = self.b.next_pc();
        self.b.patch_offset(goto_pc, join - goto_pc);
        (self.tensors, self.ints) = saved;
        self.tensors.push(merge);
    }

    /// acc = t; repeat n (1..3) times: acc = f(acc, ..).
    fn bounded_loop(&mut self) {
        let s = self.s;
        let Some(t) = self.rng.pick(&self.tensors) else { return };
        let (n, acc, c) = (self.reg(), self.reg(), self.reg());
        let times = 1 + self.rng.below(3) as i64;
        self.call(n, s.copy, vec![Arg::Imm(times)]);
        self.call(acc, s.copy, vec![Arg::Reg(t)]);
        let top = self.b.next_pc();
        let saved = (self.tensors.clone(), self.ints.clone());
        self.tensors.push(acc);
        if self.rng.chance(50) {
            self.temp_op(true);
        }
        let u = self.tensor_op(true);
        self.call(acc, s.copy, vec![Arg::Reg(u)]);
        self.call(u, s.null_value, vec![]);
        self.call(n, s.rk[DEC], vec![Arg::Reg(n)]);
        self.call(c, s.rk[GT0], vec![Arg::Reg(n)]);
        self.b.emit(Instr::If { cond: c, false_offset: 2 });
        let back = self.b.next_pc();
        self.b.emit(Instr::Goto { offset: top - back });
        (self.tensors, self.ints) = saved;
        self.tensors.push(acc);
    }

    /// A chain of one step repeated 8 to 47 times (the runs compiled mode rolls into a loop):
    /// each step writes a new tensor from the one before into one of two fresh storages in turn,
    /// and kills the one before. Now and then `rk_below` after each step stops the chain partway
    /// with an error, which every mode must report at the same pc.
    fn repeated(&mut self) {
        let s = self.s;
        let Some(input) = self.rng.pick(&self.tensors) else { return };
        let storages = [self.new_storage(), self.new_storage()];
        let steps = 8 + self.rng.below(40);
        let add = self.rng.chance(50);
        let factor = 2 + self.rng.below(2) as i64;
        let limit = self.rng.chance(50).then(|| 1i64 << self.rng.below(30));
        let mut last = input;
        for step in 0..steps {
            let t = self.reg();
            let into = Arg::Reg(storages[step % 2]);
            self.call(t, s.alloc_tensor, vec![into, Arg::Imm(0), Arg::Const(s.shape4), Arg::Const(s.f32)]);
            if add {
                self.call(VOID_REG, s.rk[ADD], vec![Arg::Reg(last), Arg::Reg(input), Arg::Reg(t)]);
            } else {
                self.call(VOID_REG, s.rk[SCALE], vec![Arg::Reg(last), Arg::Imm(factor), Arg::Reg(t)]);
            }
            if let Some(limit) = limit {
                self.call(VOID_REG, s.rk[BELOW], vec![Arg::Reg(t), Arg::Imm(limit)]);
            }
            if last != input {
                self.call(last, s.null_value, vec![]);
            }
            last = t;
        }
        self.tensors.push(last);
    }

    /// One deliberate run-time error, which every mode must report identically.
    fn failure(&mut self) {
        let s = self.s;
        let r = self.reg();
        match (self.rng.below(3), self.rng.pick(&self.ints), self.rng.pick(&self.tensors)) {
            (0, Some(i), Some(t)) => self.call(VOID_REG, s.rk[ADD], vec![Arg::Reg(i), Arg::Reg(t), Arg::Reg(t)]),
            (1, Some(i), _) => {
                let args = vec![Arg::Reg(i), Arg::Imm(1), Arg::Const(s.f32), Arg::Const(s.ctx)];
                self.call(VOID_REG, s.check_tensor_info, args);
            }
            _ => {
                self.call(r, s.make_tuple, vec![]);
                self.call(r, s.tuple_getitem, vec![Arg::Reg(r), Arg::Imm(3)]);
            }
        }
    }

    fn ret(mut self, r: i64) {
        self.b.emit(Instr::Ret { result: r });
        let regs = self.next_reg;
        self.b.end_function(regs);
        self.next_reg = regs;
    }

    fn finish(mut self) {
        let n = self.rng.below(4);
        let items: Vec<Arg> = (0..n).filter_map(|_| self.any_value()).map(Arg::Reg).collect();
        let r = self.reg();
        if items.len() == 1 && self.rng.chance(50) {
            let Arg::Reg(v) = items[0] else { unreachable!() };
            return self.ret(v);
        }
        self.call(r, self.s.make_tuple, items);
        self.ret(r)
    }
}
