//! Driving an LLM the way MLC's engine drives one exported by TVM's nn front end: a paged KV
//! cache made by the model's `create_paged_kv_cache`, sequences added, forked and popped through
//! the runtime's `vm.builtin.kv_state_*` functions, and each step an `embed`, a
//! `kv_state_begin_forward`, a `prefill` or `decode` call and a `kv_state_end_forward`.
//! `relaxc generate` and the tests use it; a C host does the same through rvm.h.

use std::path::Path;

use super::external::Weights;
use super::{HostError, HostTensor, Input, Model, Output, Value, Vm};
use crate::abi::{Any, TYPE_ARRAY, TYPE_TENSOR};

/// The functions the TVM nn / MLC export convention gives an LLM module.
pub const REQUIRED_FUNCTIONS: [&str; 4] = ["create_paged_kv_cache", "embed", "prefill", "decode"];

/// The KV cache's size.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    pub max_batch_size: i64,
    pub max_total_seq_len: i64,
    pub prefill_chunk_size: i64,
    pub page_size: i64,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig { max_batch_size: 4, max_total_seq_len: 2048, prefill_chunk_size: 256, page_size: 16 }
    }
}

/// Logits of one step: `rows` rows of `vocab` floats (one row per sequence of the step).
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The index of the largest value of row i (the first one on ties, as numpy's argmax).
    pub fn argmax(&self, i: usize) -> i32 {
        let row = self.row(i);
        let mut best = 0;
        for (k, v) in row.iter().enumerate() {
            if *v > row[best] {
                best = k;
            }
        }
        best as i32
    }
}

/// An LLM with its KV cache on one VM.
pub struct Llm<'m> {
    vm: Vm<'m>,
    p: LlmParts<'m>,
    /// Token ids must be below this (TVM's embedding kernel reads out of bounds otherwise).
    pub vocab: Option<usize>,
}

/// Everything of an Llm but its VM, as setting it up makes it.
struct LlmParts<'m> {
    model: &'m Model,
    kv: Value<'m>,
    /// Weight arguments appended to embed, prefill and decode (empty when bound).
    weights: WeightArgs,
    embed: i32,
    prefill: i32,
    decode: i32,
    reshape: Value<'m>,
    begin: Value<'m>,
    end: Value<'m>,
    config: CacheConfig,
    hidden: i64,
    /// How many sequences one decode call takes: None for a symbolic batch (any number), Some(n)
    /// where the export fixed it (a fixed export spec gives 1); steps of more run n at a time.
    decode_batch: Option<i64>,
}

fn int(v: i64) -> Any {
    Any::int(v)
}

impl<'m> Llm<'m> {
    /// Creates the model's KV cache. `path` is the model's file, read for the vocabulary size.
    pub fn new(model: &'m Model, path: &Path, config: CacheConfig) -> Result<Llm<'m>, HostError> {
        Llm::with_weights(model, path, config, None)
    }

    /// As `new`, for a model whose functions take their weights as parameters (`--weights`).
    pub fn with_weights(
        model: &'m Model,
        path: &Path,
        config: CacheConfig,
        weights: Option<&'m Weights<'m>>,
    ) -> Result<Llm<'m>, HostError> {
        Llm::on_vm_with(model, model.vm()?, path, config, weights).map_err(|(e, _)| e)
    }

    /// As `new`, on a VM the caller made (one with a host allocator, say); on failure the VM is
    /// handed back with the error.
    pub fn on_vm(
        model: &'m Model,
        vm: Vm<'m>,
        path: &Path,
        config: CacheConfig,
    ) -> Result<Llm<'m>, (HostError, Vm<'m>)> {
        Llm::on_vm_with(model, vm, path, config, None)
    }

    /// `on_vm` with external weights.
    pub fn on_vm_with(
        model: &'m Model,
        mut vm: Vm<'m>,
        path: &Path,
        config: CacheConfig,
        weights: Option<&'m Weights<'m>>,
    ) -> Result<Llm<'m>, (HostError, Vm<'m>)> {
        match Llm::setup(model, &mut vm, path, config, weights) {
            Ok((p, vocab)) => Ok(Llm { vm, p, vocab }),
            Err(e) => Err((e, vm)),
        }
    }

    /// The VM the model runs on, once the cache and everything else is released.
    pub fn into_vm(self) -> Vm<'m> {
        self.vm
    }

    fn setup(
        model: &'m Model,
        vm: &mut Vm<'m>,
        path: &Path,
        config: CacheConfig,
        weights: Option<&'m Weights<'m>>,
    ) -> Result<(LlmParts<'m>, Option<usize>), HostError> {
        let names = model.functions();
        let missing: Vec<&str> = REQUIRED_FUNCTIONS.iter().copied().filter(|f| !names.iter().any(|n| n == f)).collect();
        if !missing.is_empty() {
            return Err(HostError::Value(format!(
                "{} is not an LLM in the TVM nn / MLC convention: it has no {} (it has: {})",
                path.display(),
                missing.join(", "),
                names.join(", ")
            )));
        }
        let create = model.find("create_paged_kv_cache")?;
        let sizes = [config.max_batch_size, config.max_total_seq_len, config.prefill_chunk_size, config.page_size, 0];
        let inputs: Vec<Input> = sizes.iter().map(|v| Input::Shape(vec![*v])).collect();
        let kv = vm.call(create, &inputs)?;
        let embed = model.find("embed")?;
        // Read once: the parameter names and the embedding table's shape come from it.
        let exec = crate::inspect::load_executable(path).map_err(|e| HostError::Value(e.to_string()))?;
        let (weight_args, weight_vocab) = WeightArgs::of(model, path, &exec, weights)?;
        let hidden = hidden_size(vm, embed, &weight_args.embed)?;
        let parts = LlmParts {
            model,
            weights: weight_args,
            embed,
            hidden,
            prefill: model.find("prefill")?,
            decode: model.find("decode")?,
            reshape: model.function("vm.builtin.reshape")?,
            begin: model.function("vm.builtin.kv_state_begin_forward")?,
            end: model.function("vm.builtin.kv_state_end_forward")?,
            kv,
            config,
            decode_batch: fixed_batch(&exec, "decode"),
        };
        Ok((parts, vocab_size_of(&exec).or(weight_vocab)))
    }

    /// The cache object (borrowed; valid while self lives).
    pub fn state_handle(&self) -> Any {
        self.p.kv.any()
    }

    pub fn config(&self) -> CacheConfig {
        self.p.config
    }

    /// The VM's storage counters (to show a decode step allocates nothing).
    pub fn vm_stats(&self) -> crate::abi::VmStats {
        self.vm.stats()
    }

    /// Calls a KV-state function of the runtime on the cache with integer arguments.
    pub fn state(&self, name: &str, args: &[i64]) -> Result<Output, HostError> {
        let f = self.p.model.function(&format!("vm.builtin.{name}"))?;
        let mut all = vec![self.p.kv.any()];
        all.extend(args.iter().map(|v| int(*v)));
        Ok(self.p.model.call_function(&f, &all)?.to_output())
    }

    pub fn add_sequence(&self, seq: i64) -> Result<(), HostError> {
        self.state("kv_state_add_sequence", &[seq]).map(drop)
    }

    pub fn remove_sequence(&self, seq: i64) -> Result<(), HostError> {
        self.state("kv_state_remove_sequence", &[seq]).map(drop)
    }

    pub fn fork_sequence(&self, parent: i64, child: i64, pos: i64) -> Result<(), HostError> {
        self.state("kv_state_fork_sequence", &[parent, child, pos]).map(drop)
    }

    pub fn popn(&self, seq: i64, n: i64) -> Result<(), HostError> {
        self.state("kv_state_popn", &[seq, n]).map(drop)
    }

    pub fn clear(&self) -> Result<(), HostError> {
        self.state("kv_state_clear", &[]).map(drop)
    }

    fn int_query(&self, name: &str) -> Result<i64, HostError> {
        match self.state(name, &[])? {
            Output::Int(v) => Ok(v),
            other => Err(HostError::Value(format!("{name} returned {other:?}"))),
        }
    }

    pub fn total_sequence_length(&self) -> Result<i64, HostError> {
        self.int_query("attention_kv_cache_get_total_sequence_length")
    }

    pub fn available_pages(&self) -> Result<i64, HostError> {
        self.int_query("attention_kv_cache_get_num_available_pages")
    }

    fn check_tokens(&self, tokens: &[i32]) -> Result<(), HostError> {
        for &t in tokens {
            let bad = t < 0 || self.vocab.is_some_and(|v| t as usize >= v);
            if bad {
                let limit = self.vocab.map_or("a non-negative id".to_string(), |v| format!("ids 0..{}", v - 1));
                return Err(HostError::Value(format!("token id {t} is outside the model's vocabulary ({limit})")));
            }
        }
        Ok(())
    }

    /// Embeds tokens and shapes the embeddings as `shape` (a view: no copy).
    fn embed_as(&mut self, tokens: &[i32], shape: [i64; 3]) -> Result<Value<'m>, HostError> {
        self.check_tokens(tokens)?;
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let ids = [Input::Tensor(HostTensor::new(
            crate::abi::DLDataType { code: 0, bits: 32, lanes: 1 },
            vec![tokens.len() as i64],
            &bytes,
        ))];
        let prepared = self.p.model.prepare(&ids)?;
        let mut args = prepared.values().to_vec();
        args.extend_from_slice(&self.p.weights.embed);
        let embeds = self.vm.call_values(self.p.embed, &args)?;
        let dims = self.p.model.shape(&shape)?;
        self.p.model.call_function(&self.p.reshape, &[embeds.any(), dims.any()])
    }

    fn forward(&mut self, f: i32, seqs: &[i64], lengths: &[i64], embeds: Value<'m>) -> Result<Logits, HostError> {
        let (ids, lens) = (self.p.model.shape(seqs)?, self.p.model.shape(lengths)?);
        self.p.model.call_function(&self.p.begin, &[self.p.kv.any(), ids.any(), lens.any()])?;
        let mut args = vec![embeds.any(), self.p.kv.any()];
        args.extend_from_slice(if f == self.p.prefill { &self.p.weights.prefill } else { &self.p.weights.decode });
        let out = self.vm.call_values(f, &args)?;
        self.p.model.call_function(&self.p.end, &[self.p.kv.any()])?;
        logits_of(&out)
    }

    /// One prefill step: `tokens[i]` appended to sequence `seqs[i]`; the logits of the last
    /// token of the batch.
    pub fn prefill(&mut self, seqs: &[i64], tokens: &[Vec<i32>]) -> Result<Logits, HostError> {
        let all: Vec<i32> = tokens.iter().flatten().copied().collect();
        let embeds = self.embed_as(&all, [1, all.len() as i64, self.p.hidden])?;
        let lengths: Vec<i64> = tokens.iter().map(|t| t.len() as i64).collect();
        self.forward(self.p.prefill, seqs, &lengths, embeds)
    }

    /// One decode step: one token for each sequence; a row of logits each. Where the export
    /// fixed decode's batch, the sequences go through it that many at a time.
    pub fn decode(&mut self, seqs: &[i64], tokens: &[i32]) -> Result<Logits, HostError> {
        let group = match self.p.decode_batch {
            Some(n) if n >= 1 && (n as usize) < seqs.len() => n as usize,
            _ => {
                let embeds = self.embed_as(tokens, [tokens.len() as i64, 1, self.p.hidden])?;
                return self.forward(self.p.decode, seqs, &vec![1; seqs.len()], embeds);
            }
        };
        if !seqs.len().is_multiple_of(group) {
            return Err(HostError::Value(format!(
                "decode takes exactly {group} sequences a call (its batch is fixed), and this step has {}",
                seqs.len()
            )));
        }
        let mut all: Option<Logits> = None;
        for (ids, toks) in seqs.chunks(group).zip(tokens.chunks(group)) {
            let embeds = self.embed_as(toks, [toks.len() as i64, 1, self.p.hidden])?;
            let part = self.forward(self.p.decode, ids, &vec![1; ids.len()], embeds)?;
            match all.as_mut() {
                None => all = Some(part),
                Some(a) => {
                    a.rows += part.rows;
                    a.data.extend_from_slice(&part.data);
                }
            }
        }
        all.ok_or_else(|| HostError::Value("decode: no sequences".into()))
    }

    /// How many sequences one decode call takes, where the export fixed it.
    pub fn decode_batch(&self) -> Option<i64> {
        self.p.decode_batch
    }
}

/// The first dimension of `function`'s first parameter where the export fixed it to a number,
/// read from the annotation the executable carries for its argument check (TVM writes each
/// parameter's `R.Tensor((dims), dtype)` into the match_shape error context); None when it is
/// symbolic or cannot be read.
pub fn fixed_batch(exec: &crate::vm::Executable, function: &str) -> Option<i64> {
    let wanted = format!("ErrorContext(fn={function}, loc=param[0], ");
    exec.constants.iter().find_map(|c| match c {
        crate::vm::Constant::Str(s) => {
            let rest = &s[s.find(&wanted)? + wanted.len()..];
            let dims = rest[rest.find("annotation=R.Tensor((")? + "annotation=R.Tensor((".len()..].split(')').next()?;
            dims.split(',').next()?.trim().parse::<i64>().ok()
        }
        _ => None,
    })
}

/// The embedding width, from embedding one token (0) once.
fn hidden_size(vm: &mut Vm, embed: i32, weights: &[Any]) -> Result<i64, HostError> {
    let bytes = 0i32.to_le_bytes();
    let ids = [Input::Tensor(HostTensor::new(crate::abi::DLDataType { code: 0, bits: 32, lanes: 1 }, vec![1], &bytes))];
    let prepared = vm.prepare(&ids)?;
    let mut args = prepared.values().to_vec();
    args.extend_from_slice(weights);
    match vm.call_values(embed, &args)?.to_output() {
        Output::Tensor { shape, .. } if shape.len() == 2 => Ok(shape[1]),
        other => Err(HostError::Value(format!("embed returned {other:?}, expected an [n, hidden] tensor"))),
    }
}

/// The weight arguments of embed, prefill and decode: for a model exported with its weights as
/// parameters, the parameters after each function's inputs (1, 2 and 2), by name from `weights`.
#[derive(Default)]
struct WeightArgs {
    embed: Vec<Any>,
    prefill: Vec<Any>,
    decode: Vec<Any>,
}

impl WeightArgs {
    /// The arguments, and the vocabulary size read from the embedding table among them.
    fn of(
        model: &Model,
        path: &Path,
        exec: &crate::vm::Executable,
        weights: Option<&Weights>,
    ) -> Result<(WeightArgs, Option<usize>), HostError> {
        let params = |name: &str, inputs: usize| -> Vec<String> {
            exec.funcs
                .iter()
                .find(|f| f.name == name)
                .map(|f| f.param_names.iter().skip(inputs).cloned().collect())
                .unwrap_or_default()
        };
        let embed_params = params("embed", 1);
        let Some(w) = weights else {
            let prefill_params = params("prefill", 2);
            if let Some(first) = embed_params.first().or(prefill_params.first()) {
                let n = embed_params.len().max(prefill_params.len());
                return Err(HostError::Value(format!(
                    "{} takes its {n} weights as parameters ({first}, ...): pass them with --weights (a tensor cache or safetensors)",
                    path.display()
                )));
            }
            return Ok((WeightArgs::default(), None));
        };
        let embed = w.arguments(model.find("embed")?, 1)?;
        let vocab = embed_params
            .iter()
            .position(|n| n.contains("embed"))
            .and_then(|i| embed.get(i))
            .and_then(crate::host::external::shape_of)
            .filter(|s| s.len() == 2)
            .map(|s| s[0] as usize);
        let prefill = w.arguments(model.find("prefill")?, 2)?;
        let decode = w.arguments(model.find("decode")?, 2)?;
        Ok((WeightArgs { embed, prefill, decode }, vocab))
    }
}

/// The logits tensor of a prefill/decode result `(logits, kv)`.
fn logits_of(out: &Value) -> Result<Logits, HostError> {
    let any = out.any();
    let logits = if any.type_index == TYPE_ARRAY {
        match out.to_output() {
            Output::Tuple(mut items) if !items.is_empty() => items.swap_remove(0),
            other => return Err(HostError::Value(format!("expected (logits, kv), got {other:?}"))),
        }
    } else if any.type_index == TYPE_TENSOR {
        out.to_output()
    } else {
        return Err(HostError::Value("expected logits".into()));
    };
    match logits {
        Output::Tensor { dtype, shape, data } if dtype.code == 2 && dtype.bits == 32 && !shape.is_empty() => {
            let vocab = *shape.last().unwrap_or(&0) as usize;
            let values: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            let rows = values.len().checked_div(vocab).unwrap_or(0);
            Ok(Logits { rows, vocab, data: values })
        }
        other => Err(HostError::Value(format!("expected float32 logits, got {other:?}"))),
    }
}

/// The vocabulary size: the rows of the one 2-D constant table `embed` reads.
pub fn vocab_size(path: &Path) -> Option<usize> {
    vocab_size_of(&crate::inspect::load_executable(path).ok()?)
}

/// `vocab_size` of an executable already read.
fn vocab_size_of(exec: &crate::vm::Executable) -> Option<usize> {
    let f = exec.funcs.iter().find(|f| f.name == "embed" && f.kind != crate::vm::FuncKind::Packed)?;
    let mut tables = std::collections::BTreeSet::new();
    for k in f.start_instr..f.end_instr {
        if let Ok(crate::vm::Instr::Call { args, .. }) = exec.instr(k as usize) {
            for a in args {
                if let crate::vm::Arg::Const(c) = a
                    && let Some(crate::vm::Constant::Tensor(t)) = exec.constants.get(c as usize)
                    && t.shape.len() == 2
                {
                    tables.insert(t.shape[0]);
                }
            }
        }
    }
    if tables.len() == 1 { tables.first().map(|v| *v as usize) } else { None }
}
