//! Out of memory at every allocation (rvm.h's host allocators, ABI version 3).
//!
//! A VM gets an allocator that counts its blocks and fails the Nth request. For every N from 1
//! to the number of allocations a first call makes, in both modes: the call fails with a
//! MemoryError that says "out of memory"; the same VM then gives the right result once memory is
//! back; and when the VM and its results are gone the allocator has every block back. Every TVM
//! fixture's first case, the closures program, and the tiny Llama (cache creation, prefill and
//! decode on the paged KV cache) go through it. tests/c/oom_test.c does the same from a plain C
//! host under valgrind.
//!
//! Also on that allocator: after a warm-up call, calls whose results are released between them
//! take nothing from it, in both modes.

mod common;

use std::path::Path;

use libtest_mimic::{Arguments, Failed, Trial};
use relaxc::codegen::ExecMode;
use relaxc::host::heap::CountingHeap;
use relaxc::host::llm::{CacheConfig, Llm};
use relaxc::host::{HostError, Input, Model, Output, npz};

/// The counting allocator of `relaxc::host::heap`, and VMs on it.
struct Heap(CountingHeap);

impl std::ops::Deref for Heap {
    type Target = CountingHeap;
    fn deref(&self) -> &CountingHeap {
        &self.0
    }
}

impl Heap {
    fn new() -> Heap {
        Heap(CountingHeap::new())
    }

    fn vm<'m>(&self, model: &'m Model) -> relaxc::host::Vm<'m> {
        // SAFETY: every test drops its VMs and values before the Heap (declared first, dropped last).
        unsafe { model.vm_with_allocator(self.allocator()) }.expect("vm_create_with_allocator")
    }
}

/// An error from a refused allocation must say so, with its kind.
fn is_out_of_memory(e: &HostError) -> Result<(), String> {
    match e {
        HostError::Call { kind, message } if kind == "MemoryError" && message.contains("out of memory") => Ok(()),
        other => Err(format!("not an out-of-memory error: {other}")),
    }
}

/// What the walk over N saw, for the trial's report.
struct Walk {
    per_call: i64,
    /// N whose request never came (a run that took fewer allocations, e.g. a parallel kernel run
    /// serially because the pool was busy with another test's launch).
    not_reached: i64,
}

/// Walks N over `per_call` allocations of `run`, which must fail when an allocation is refused
/// and give `expected` once memory is back (on the same VM).
fn walk(heap: &Heap, per_call: i64, mut run: impl FnMut(i64) -> Result<(), String>) -> Result<Walk, String> {
    let mut not_reached = 0;
    for n in 1..=per_call {
        match run(n) {
            Ok(()) => {}
            Err(e) if e == "not reached" => not_reached += 1,
            Err(e) => return Err(format!("N={n} of {per_call}: {e}")),
        }
        if heap.live() != 0 {
            return Err(format!("N={n}: {} blocks not returned to the allocator", heap.live()));
        }
    }
    Ok(Walk { per_call, not_reached })
}

fn tensor_model(so: &Path, inputs: &[Input], check: &dyn Fn(&[Output]) -> Result<(), String>) -> Result<Walk, String> {
    let heap = Heap::new();
    let model = Model::load(so).map_err(|e| e.to_string())?;
    let main = model.find("main").map_err(|e| e.to_string())?;
    let per_call = {
        let mut vm = heap.vm(&model);
        let before = heap.calls();
        let out = vm.call(main, inputs).map_err(|e| format!("with memory: {e}"))?;
        let per_call = heap.calls() - before;
        check(&out.to_output().flatten())?;
        if model.value_allocator(&out).map_err(|e| e.to_string())? != Some(heap.allocator()) {
            return Err("value_allocator does not name the VM's allocator".into());
        }
        drop(vm);
        if heap.live() == 0 {
            return Err("the result's memory went back to the allocator while the result lived".into());
        }
        per_call
    };
    if heap.live() != 0 {
        return Err(format!("{} blocks not returned after the VM and its result are gone", heap.live()));
    }
    if per_call == 0 {
        return Err("a first call allocated nothing through the host allocator".into());
    }
    walk(&heap, per_call, |n| {
        let mut vm = heap.vm(&model);
        heap.fail_in(n);
        let failed = vm.call(main, inputs);
        let refused = heap.refused();
        heap.fail_in(0);
        match failed {
            Ok(_) if refused => return Err("the call succeeded although an allocation was refused".into()),
            Ok(_) => return Err("not reached".into()),
            Err(e) => is_out_of_memory(&e)?,
        }
        let again = vm.call(main, inputs).map_err(|e| format!("the same VM fails once memory is back: {e}"))?;
        check(&again.to_output().flatten()).map_err(|e| format!("once memory is back: {e}"))
    })
}

/// One cycle of the tiny Llama on an Llm: a sequence added, a prompt prefilled, one token
/// decoded, the sequence removed; the two rows of logits.
fn llm_cycle(llm: &mut Llm) -> Result<(Vec<f32>, Vec<f32>), HostError> {
    llm.add_sequence(0)?;
    let prefill = llm.prefill(&[0], &[vec![1, 17, 42, 5, 33, 8]])?;
    let decode = llm.decode(&[0], &[prefill.argmax(prefill.rows - 1)])?;
    llm.remove_sequence(0)?;
    Ok((prefill.row(prefill.rows - 1).to_vec(), decode.row(0).to_vec()))
}

fn tiny_llama(mode: ExecMode) -> Result<Walk, String> {
    let dir = common::fixtures_dir().join("tiny_llama");
    let so = common::build("tiny_llama", &dir.join("m.tar"), mode)?;
    let model = Model::load(&so).map_err(|e| e.to_string())?;
    let config = CacheConfig { max_batch_size: 2, max_total_seq_len: 256, prefill_chunk_size: 64, page_size: 16 };
    let expected = {
        let mut llm = Llm::new(&model, &so, config).map_err(|e| e.to_string())?;
        llm_cycle(&mut llm).map_err(|e| e.to_string())?
    };
    let heap = Heap::new();
    let per_call = {
        let vm = heap.vm(&model);
        let before = heap.calls();
        let mut llm = Llm::on_vm(&model, vm, &so, config).map_err(|(e, _)| e.to_string())?;
        let got = llm_cycle(&mut llm).map_err(|e| e.to_string())?;
        if got != expected {
            return Err("logits on the host allocator differ from the plain VM's".into());
        }
        heap.calls() - before
    };
    if heap.live() != 0 {
        return Err(format!("{} blocks not returned after the cache and VM are gone", heap.live()));
    }
    walk(&heap, per_call, |n| {
        let vm = heap.vm(&model);
        heap.fail_in(n);
        let (mut llm, failure) = match Llm::on_vm(&model, vm, &so, config) {
            Ok(mut llm) => {
                let r = llm_cycle(&mut llm).err();
                (llm, r)
            }
            Err((e, vm)) => {
                // Creating the cache failed: the same VM creates it once memory is back.
                heap.fail_in(0);
                is_out_of_memory(&e)?;
                let llm =
                    Llm::on_vm(&model, vm, &so, config).map_err(|(e, _)| format!("cache once memory is back: {e}"))?;
                (llm, Some(e))
            }
        };
        let refused = heap.refused();
        heap.fail_in(0);
        match failure {
            None if refused => return Err("the cycle succeeded although an allocation was refused".into()),
            None => return Err("not reached".into()),
            Some(e) => is_out_of_memory(&e)?,
        }
        // The cache is usable again: drop what the failed step left, and run the cycle.
        let _ = llm.remove_sequence(0);
        let got = llm_cycle(&mut llm).map_err(|e| format!("the same cache fails once memory is back: {e}"))?;
        if got != expected {
            return Err("wrong logits once memory is back".into());
        }
        drop(llm.into_vm());
        Ok(())
    })
}

/// A warm-up call, then calls whose results are released between them, all of which must take
/// nothing from the VM's allocator: storages, tensor and Storage objects and the wrappers of the
/// arguments come back to the VM's caches, the result's too although it dies after its call.
fn steady_calls(so: &Path, inputs: &[Input]) -> Result<(), String> {
    let heap = Heap::new();
    let model = Model::load(so).map_err(|e| e.to_string())?;
    let main = model.find("main").map_err(|e| e.to_string())?;
    let mut vm = heap.vm(&model);
    drop(vm.call(main, inputs).map_err(|e| format!("warm-up: {e}"))?);
    let before = heap.calls();
    for _ in 0..5 {
        drop(vm.call(main, inputs).map_err(|e| e.to_string())?);
    }
    match heap.calls() - before {
        0 => Ok(()),
        taken => Err(format!("5 calls after a warm-up took {taken} allocations from the VM's allocator")),
    }
}

fn verdict(walk: Result<Walk, String>, what: &str) -> Result<(), Failed> {
    let walk = walk.map_err(|e| Failed::from(format!("{what}: {e}")))?;
    if walk.not_reached * 2 > walk.per_call {
        return Err(format!("{what}: {} of {} refusals never came", walk.not_reached, walk.per_call).into());
    }
    eprintln!(
        "{what}: {} allocations per call, each refused in turn ({} not reached)",
        walk.per_call, walk.not_reached
    );
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let m = common::mode_name(mode);
        let mut fixtures = common::fixtures();
        fixtures.extend(common::script_fixtures().into_iter().filter(|f| f.name == "closures"));
        // inplace_const writes its constants on every call (as TVM does), so a second call's
        // result differs from the first by design: it cannot show "the same result once memory
        // is back".
        for fixture in fixtures.into_iter().filter(|f| f.name != "inplace_const") {
            let Some(case) = fixture.ok_cases.first().cloned() else { continue };
            let name = format!("{}_{}_{m}", fixture.name, case);
            trials.push(Trial::test(name.clone(), move || {
                let so = fixture.build(mode)?;
                let inputs =
                    npz::read_inputs(&fixture.dir.join(format!("ok_{case}.in.npz"))).map_err(|e| e.to_string())?;
                let check = |out: &[Output]| fixture.check_outputs(out, &case);
                verdict(tensor_model(&so, &inputs, &check), &name)
            }));
        }
        for fixture in common::fixtures().into_iter().filter(|f| ["chain_100", "mlp_static"].contains(&f.name.as_str()))
        {
            trials.push(Trial::test(format!("steady_calls_allocate_nothing_{}_{m}", fixture.name), move || {
                let case = fixture.ok_cases.first().ok_or("no ok case")?;
                let inputs =
                    npz::read_inputs(&fixture.dir.join(format!("ok_{case}.in.npz"))).map_err(|e| e.to_string())?;
                Ok(steady_calls(&fixture.build(mode)?, &inputs)?)
            }));
        }
        trials.push(Trial::test(format!("tiny_llama_prefill_decode_{m}"), move || {
            verdict(tiny_llama(mode), &format!("tiny_llama ({m})"))
        }));
    }
    libtest_mimic::run(&args, trials).exit();
}
