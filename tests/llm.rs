//! The tiny Llama (fixtures/tvm/tiny_llama) run on relaxc's paged KV cache, in both modes, against
//! TVM's recorded runs: greedy tokens and every step's logits bit for bit; batches, chunked
//! prefill, forks, popn, remove and clear; TVM's error texts; no storage allocated by a decode
//! step after warm-up. The same runs of tiny_llama_lib, the model built with relaxc.tvm.build
//! (its projections and norms on relaxc's kernel library), against TVM's VM on those kernels.

mod common;

use std::path::PathBuf;

use libtest_mimic::{Arguments, Completion, Trial};
use relaxc::codegen::ExecMode;
use relaxc::host::llm::{CacheConfig, Llm, Logits};
use relaxc::host::{HostError, Model, npz};
use serde_json::Value as Json;

const LLM: &str = "tiny_llama";
const LIBRARY_LLM: &str = "tiny_llama_lib";

fn fixture() -> PathBuf {
    fixture_named(LLM)
}

fn fixture_named(name: &str) -> PathBuf {
    common::fixtures_dir().join(name)
}

fn scenarios() -> Json {
    scenarios_of(LLM)
}

fn scenarios_of(name: &str) -> Json {
    let text = std::fs::read_to_string(fixture_named(name).join("scenarios.json")).expect("scenarios.json");
    serde_json::from_str(&text).expect("valid JSON")
}

fn config(s: &Json) -> CacheConfig {
    let c = &s["config"];
    let get = |k: &str| c[k].as_i64().expect("config field");
    CacheConfig {
        max_batch_size: get("max_batch_size"),
        max_total_seq_len: get("max_total_seq_len"),
        prefill_chunk_size: get("prefill_chunk_size"),
        page_size: get("page_size"),
    }
}

fn build(mode: ExecMode) -> PathBuf {
    build_named(LLM, mode)
}

fn build_named(name: &str, mode: ExecMode) -> PathBuf {
    common::build(name, &fixture_named(name).join("m.tar"), mode).unwrap_or_else(|e| panic!("build {name}: {e}"))
}

fn ints(v: &Json) -> Vec<i64> {
    v.as_array().expect("array").iter().map(|x| x.as_i64().expect("int")).collect()
}

fn tokens(v: &Json) -> Vec<i32> {
    ints(v).into_iter().map(|t| t as i32).collect()
}

/// Runs one scenario step; the logits of prefill and decode steps.
fn step(llm: &mut Llm, s: &Json) -> Result<Option<Logits>, HostError> {
    let get = |k: &str| s[k].as_i64().expect("step field");
    match s["op"].as_str().expect("op") {
        "add" => llm.add_sequence(get("seq")).map(|_| None),
        "remove" => llm.remove_sequence(get("seq")).map(|_| None),
        "fork" => llm.fork_sequence(get("parent"), get("child"), get("pos")).map(|_| None),
        "popn" => llm.popn(get("seq"), get("n")).map(|_| None),
        "clear" => llm.clear().map(|_| None),
        "prefill" => {
            let toks: Vec<Vec<i32>> = s["tokens"].as_array().expect("tokens").iter().map(tokens).collect();
            llm.prefill(&ints(&s["seqs"]), &toks).map(Some)
        }
        "decode" => llm.decode(&ints(&s["seqs"]), &tokens(&s["tokens"])).map(Some),
        "check" => {
            assert_eq!(llm.total_sequence_length()?, get("total"), "total sequence length");
            assert_eq!(llm.available_pages()?, get("available"), "available pages");
            Ok(None)
        }
        other => panic!("unknown step {other}"),
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn run_scenarios(fixture_name: &str, mode: ExecMode) {
    let so = build_named(fixture_name, mode);
    let model = Model::load(&so).expect("load");
    let all = scenarios_of(fixture_name);
    let cfg = config(&all);
    for scenario in all["scenarios"].as_array().expect("scenarios") {
        let name = scenario["name"].as_str().expect("name");
        let want = npz::read_arrays(&fixture_named(fixture_name).join(format!("{name}.npz"))).expect("logits");
        let mut llm = Llm::new(&model, &so, cfg).expect("create the cache");
        for (i, s) in scenario["steps"].as_array().expect("steps").iter().enumerate() {
            let got = step(&mut llm, s).unwrap_or_else(|e| panic!("{name} step {i} ({s}): {e}"));
            if let Some(logits) = got {
                let (_, shape, bytes) = want.get(&format!("step{i}")).unwrap_or_else(|| panic!("{name}: no step{i}"));
                assert_eq!(shape.iter().product::<u64>() as usize, logits.data.len(), "{name} step {i}: logits size");
                assert!(
                    same_bits(&logits.data, &f32s(bytes)),
                    "{name} step {i} ({}): logits differ from TVM's",
                    common::mode_name(mode)
                );
            }
        }
    }
}

fn scenarios_match_tvm_bytecode() {
    run_scenarios(LLM, ExecMode::Bytecode);
}

fn scenarios_match_tvm_compiled() {
    run_scenarios(LLM, ExecMode::Compiled);
}

fn library_scenarios_match_tvm_bytecode() {
    run_scenarios(LIBRARY_LLM, ExecMode::Bytecode);
}

fn library_scenarios_match_tvm_compiled() {
    run_scenarios(LIBRARY_LLM, ExecMode::Compiled);
}

fn generate_matches(fixture_name: &str, mode: ExecMode) {
    let so = build_named(fixture_name, mode);
    let model = Model::load(&so).expect("load");
    let want = npz::read_arrays(&fixture_named(fixture_name).join("generate.npz")).expect("generate.npz");
    let prompt: Vec<i32> =
        want["prompt"].2.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let want_tokens: Vec<i32> =
        want["tokens"].2.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let mut llm = Llm::new(&model, &so, config(&scenarios_of(fixture_name))).expect("cache");
    assert_eq!(llm.vocab, Some(64), "the vocabulary size read from embed's table");
    llm.add_sequence(0).expect("add");
    let mut logits = vec![llm.prefill(&[0], &[prompt]).expect("prefill")];
    let mut toks = vec![logits[0].argmax(0)];
    let mut warm = None;
    while toks.len() < want_tokens.len() {
        if toks.len() == 3 {
            let s = llm.vm_stats();
            warm = Some((s.storage_allocations, s.storage_allocations - s.pool_hits));
        }
        logits.push(llm.decode(&[0], &[*toks.last().expect("token")]).expect("decode"));
        toks.push(logits.last().expect("logits").argmax(0));
    }
    assert_eq!(toks, want_tokens, "greedy tokens ({})", common::mode_name(mode));
    let got: Vec<f32> = logits.iter().flat_map(|l| l.data.iter().copied()).collect();
    assert!(same_bits(&got, &f32s(&want["logits"].2)), "logits of every step are TVM's bits");
    // After warm-up a decode step allocates nothing new: every storage comes from the pool.
    let stats = llm.vm_stats();
    let (allocations, fresh) = warm.expect("warm-up point");
    assert!(stats.storage_allocations > allocations, "decode steps take storage for their activations");
    assert_eq!(
        stats.storage_allocations - stats.pool_hits,
        fresh,
        "no decode step after warm-up allocated new storage: {stats:?}"
    );
}

fn greedy_generation_matches_tvm_bytecode() {
    generate_matches(LLM, ExecMode::Bytecode);
}

fn greedy_generation_matches_tvm_compiled() {
    generate_matches(LLM, ExecMode::Compiled);
}

fn library_greedy_generation_matches_tvm_bytecode() {
    generate_matches(LIBRARY_LLM, ExecMode::Bytecode);
}

fn library_greedy_generation_matches_tvm_compiled() {
    generate_matches(LIBRARY_LLM, ExecMode::Compiled);
}

/// The library build (its attention on relaxc's paged-KV-cache kernels) gives the default build's
/// tokens in every recorded scenario (prefill, chunked prefill, decode, batches, forks), with every
/// float within 1e-5 of the largest (1.1e-6 measured).
fn library_generation_is_close_to_tvms_default_kernels() {
    for scenario in ["generate", "batch", "batch_prefill", "chunked", "fork", "popn_remove"] {
        let file = format!("{scenario}.npz");
        let lib = npz::read_arrays(&fixture_named(LIBRARY_LLM).join(&file)).expect("library scenario");
        let default = npz::read_arrays(&fixture().join(&file)).expect("default scenario");
        assert_eq!(lib.len(), default.len(), "{scenario}: the same arrays");
        for (name, want) in &default {
            let got = &lib[name];
            if want.0 == "<f4" {
                let (a, b) = (f32s(&got.2), f32s(&want.2));
                let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-5 * scale, "{scenario} {name}: {worst} apart (scale {scale})");
            } else {
                assert_eq!(got.2, want.2, "{scenario} {name}");
            }
        }
    }
}

fn failing_calls_give_tvms_errors() {
    let so = build(ExecMode::Bytecode);
    let model = Model::load(&so).expect("load");
    let all = scenarios();
    for e in all["errors"].as_array().expect("errors") {
        let name = e["name"].as_str().expect("name");
        let mut llm = Llm::new(&model, &so, config(&all)).expect("cache");
        for s in e["setup"].as_array().expect("setup") {
            step(&mut llm, s).expect("setup step");
        }
        match step(&mut llm, &e["call"]) {
            Err(HostError::Call { kind, message }) => {
                let message = common::strip_location(&message).to_string();
                assert_eq!(
                    (kind.as_str(), message.as_str()),
                    (e["kind"].as_str().expect("kind"), e["message"].as_str().expect("message")),
                    "{name}"
                );
            }
            other => panic!("{name}: expected TVM's error, got {:?}", other.map(|_| ())),
        }
        // A failed call leaves the cache usable.
        let before = llm.total_sequence_length().expect("length");
        assert!(before >= 0, "{name}");
    }
}

fn expect_error(result: Result<impl std::fmt::Debug, HostError>, needle: &str) {
    match result {
        Err(e) => assert!(e.to_string().contains(needle), "expected an error with {needle:?}, got: {e}"),
        Ok(v) => panic!("expected an error with {needle:?}, got {v:?}"),
    }
}

fn bad_input_is_a_clear_error_not_a_crash() {
    let so = build(ExecMode::Compiled);
    let model = Model::load(&so).expect("load");
    let cfg = config(&scenarios());
    let mut llm = Llm::new(&model, &so, cfg).expect("cache");
    llm.add_sequence(0).expect("add");
    // A token id past the vocabulary: TVM's embedding kernel reads out of bounds.
    expect_error(llm.prefill(&[0], &[vec![1, 64]]), "token id 64 is outside the model's vocabulary (ids 0..63)");
    expect_error(llm.decode(&[0], &[-3]), "token id -3");
    // A prompt longer than one step may carry, and longer than the cache.
    expect_error(llm.prefill(&[0], &[vec![1; 40]]), "more than the cache's prefill_chunk_size (32)");
    let tokens_full: Vec<i32> = vec![1; 32];
    for _ in 0..4 {
        llm.prefill(&[0], std::slice::from_ref(&tokens_full)).expect("fill the cache");
    }
    expect_error(llm.prefill(&[0], std::slice::from_ref(&tokens_full)), "The KV cache is full");
    // The failed step changed nothing: the sequence keeps its 128 tokens.
    assert_eq!(llm.total_sequence_length().expect("length"), 128);
    // An empty batch (TVM crashes) and a sequence given twice.
    let begin = model.function("vm.builtin.kv_state_begin_forward").expect("begin");
    let empty = model.shape(&[]).expect("shape");
    expect_error(llm_call(&model, &begin, &llm, &[empty.any(), empty.any()]), "the batch is empty");
    llm.add_sequence(1).expect("add");
    expect_error(llm.decode(&[1, 1], &[2, 3]), "sequence 1 appears twice");
    // Features outside the subset name themselves.
    expect_error(llm.state("attention_kv_cache_enable_sliding_window_for_seq", &[0, 8, 2]), "sliding windows");
    expect_error(llm.state("kv_cache_disagg_prepare_recv", &[0, 1]), "KV disaggregation");
    // The wrong arity, and the wrong first argument.
    expect_error(llm.state("kv_state_fork_sequence", &[0, 1]), "Expected 4 but got 3 arguments");
    let popn = model.function("vm.builtin.kv_state_popn").expect("popn");
    let r = model.call_function(&popn, &[relaxc::abi::Any::int(0), relaxc::abi::Any::int(1)]);
    expect_error(r.map(|v| v.to_output()), "expects a PagedAttentionKVCache");
}

fn llm_call(
    model: &Model,
    f: &relaxc::host::Value,
    llm: &Llm,
    rest: &[relaxc::abi::Any],
) -> Result<relaxc::host::Output, HostError> {
    // The cache is the first argument of every state function.
    let kv = llm.state_handle();
    let mut args = vec![kv];
    args.extend_from_slice(rest);
    model.call_function(f, &args).map(|v| v.to_output())
}

fn sliding_window_caches_are_refused_at_creation() {
    let so = build(ExecMode::Bytecode);
    let model = Model::load(&so).expect("load");
    let create = model.find("create_paged_kv_cache").expect("create");
    let mut vm = model.vm().expect("vm");
    let args: Vec<relaxc::host::Input> =
        [4, 128, 32, 16, 1].iter().map(|v| relaxc::host::Input::Shape(vec![*v])).collect();
    expect_error(vm.call(create, &args).map(|v| v.to_output()), "does not support sliding windows");
}

fn id_list(bytes: &[u8]) -> String {
    bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn relaxc_cli() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
}

/// tiny_llama_params: the model exported with its weights as parameters (and tiny_llama_packed:
/// the same as one tuple, TVM nn's "packed" mode). `relaxc generate --weights` with TVM's tensor
/// cache and with safetensors gives TVM's tokens and logits bit for bit, in both modes; `relaxc
/// run --weights` runs one function; without weights the error says what to pass.
fn external_weights_give_tvms_tokens_and_logits() {
    let dir = fixture_named("tiny_llama_params");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = build_named("tiny_llama_packed", mode);
        let want = npz::read_arrays(&fixture_named("tiny_llama_packed").join("generate.npz")).expect("generate.npz");
        for weights in [dir.join("tensor-cache"), dir.join("params.safetensors")] {
            let logits = tempfile::tempdir().expect("tempdir").keep().join("logits.npz");
            let out = relaxc_cli()
                .arg("generate")
                .arg(&so)
                .args(["--prompt", "1,17,42,5,9,33", "--max-new-tokens", "16", "--weights"])
                .arg(&weights)
                .arg("--logits")
                .arg(&logits)
                .output()
                .expect("relaxc generate");
            assert!(
                out.status.success(),
                "packed ({}): {}",
                common::mode_name(mode),
                String::from_utf8_lossy(&out.stderr)
            );
            let got = npz::read_arrays(&logits).expect("logits");
            assert!(
                got["logits"].2 == want["logits"].2,
                "packed ({}): logits differ from TVM's",
                common::mode_name(mode)
            );
            let _ = std::fs::remove_dir_all(logits.parent().expect("dir"));
        }
    }
    let want = npz::read_arrays(&dir.join("generate.npz")).expect("generate.npz");
    let ids = |b: &[u8]| {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (prompt, tokens) = (ids(&want["prompt"].2), ids(&want["tokens"].2));
    let scratch = tempfile::tempdir().expect("tempdir");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = build_named("tiny_llama_params", mode);
        for weights in [dir.join("tensor-cache"), dir.join("params.safetensors")] {
            let logits = scratch.path().join("logits.npz");
            let out = relaxc_cli()
                .arg("generate")
                .arg(&so)
                .args(["--prompt", &prompt, "--max-new-tokens", "16", "--weights"])
                .arg(&weights)
                .arg("--logits")
                .arg(&logits)
                .output()
                .expect("relaxc generate");
            let what = format!("{} with {}", common::mode_name(mode), weights.display());
            assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.contains(&format!("tokens: {}", tokens.replace(',', " "))), "{what}: {stdout}");
            let got = npz::read_arrays(&logits).expect("logits");
            assert!(got["logits"].2 == want["logits"].2, "{what}: logits differ from TVM's");
        }
        let out = relaxc_cli().arg("generate").arg(&so).args(["--prompt", "1,2"]).output().expect("relaxc generate");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("pass them with --weights"), "{err}");
        let inputs = scratch.path().join("ids.npz");
        npz::write_named(
            &inputs,
            &[(
                "arg0".to_string(),
                &relaxc::host::Output::Tensor {
                    dtype: relaxc::abi::DLDataType { code: 0, bits: 32, lanes: 1 },
                    shape: vec![3],
                    data: [1i32, 17, 42].iter().flat_map(|v| v.to_le_bytes()).collect(),
                },
            )],
        )
        .expect("write ids");
        let out = relaxc_cli()
            .arg("run")
            .arg(&so)
            .args(["--func", "embed", "--inputs"])
            .arg(&inputs)
            .arg("--weights")
            .arg(dir.join("tensor-cache"))
            .output()
            .expect("relaxc run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("shape [3, 32]"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every kind of broken weight file is an error that names the tensor and the file: a tensor
/// missing, the wrong dtype or shape (TVM's own check, which names the parameter), a truncated
/// shard, an index pointing past its file, an index that is not JSON, a missing shard, and a
/// truncated safetensors file.
fn broken_weight_files_are_clear_errors() {
    let dir = fixture_named("tiny_llama_params");
    let so = build_named("tiny_llama_params", ExecMode::Bytecode);
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tensor-cache/tensor-cache.json")).expect("index"))
            .expect("json");
    let shard = std::fs::read(dir.join("tensor-cache/params_shard_0.bin")).expect("shard");
    let run = |weights: &std::path::Path| {
        let out = relaxc_cli()
            .arg("generate")
            .arg(&so)
            .args(["--prompt", "1,2", "--weights"])
            .arg(weights)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // The same files through rvm.h's weights_open, from a C host.
    let exe = common::build_c_host("llm_test");
    let c_host = |weights: &std::path::Path| {
        let out = std::process::Command::new(&exe)
            .arg("--weights")
            .arg(weights)
            .arg(&so)
            .args(["1,2", "3"])
            .output()
            .expect("llm_test");
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    type Edit = fn(&mut serde_json::Value, &mut Vec<u8>);
    let cases: [(&str, Edit, &[&str]); 6] = [
        (
            "missing",
            |j, _| {
                j["records"][0]["records"].as_array_mut().expect("records").remove(1);
            },
            &["layers.0.attn_norm.weight", "does not have"],
        ),
        ("dtype", |j, _| j["records"][0]["records"][0]["dtype"] = "int32".into(), &["embed_tokens.weight", "dtype"]),
        (
            "shape",
            |j, _| j["records"][0]["records"][0]["shape"] = serde_json::json!([32, 64]),
            &["embed_tokens.weight"],
        ),
        ("truncated", |_, s| s.truncate(s.len() - 100), &["lm_head.weight", "params_shard_0.bin", "truncated"]),
        (
            "past_end",
            |j, _| j["records"][0]["records"][2]["byteOffset"] = (1u64 << 40).into(),
            &["layers.0.attn.qkv_proj.weight", "params_shard_0.bin", "past the end"],
        ),
        ("not_json", |_, _| {}, &["tensor-cache.json", "not valid JSON"]),
    ];
    for (name, edit, says) in cases {
        let broken = tempfile::tempdir().expect("tempdir");
        let (mut j, mut s) = (index.clone(), shard.clone());
        edit(&mut j, &mut s);
        let text = if name == "not_json" { "{\"records\": [".to_string() } else { j.to_string() };
        std::fs::write(broken.path().join("tensor-cache.json"), text).expect("write index");
        std::fs::write(broken.path().join("params_shard_0.bin"), &s).expect("write shard");
        let err = run(broken.path());
        let c_err = c_host(broken.path());
        for word in says {
            assert!(err.contains(word), "{name}: the error does not say {word:?}: {err}");
            assert!(c_err.contains(word), "{name} (C host): the error does not say {word:?}: {c_err}");
        }
    }
    let broken = tempfile::tempdir().expect("tempdir");
    std::fs::write(broken.path().join("tensor-cache.json"), index.to_string()).expect("write index");
    for err in [run(broken.path()), c_host(broken.path())] {
        assert!(err.contains("params_shard_0.bin") && err.contains("No such file"), "missing shard: {err}");
    }
    let safetensors = std::fs::read(dir.join("params.safetensors")).expect("safetensors");
    let cut = broken.path().join("cut.safetensors");
    std::fs::write(&cut, &safetensors[..safetensors.len() - 64]).expect("write");
    for err in [run(&cut), c_host(&cut)] {
        assert!(err.contains("cut.safetensors"), "truncated safetensors: {err}");
    }
}

/// `relaxc generate --soak 20000` in both modes: 20,000 tokens in rounds of add, prefill,
/// decode, fork, batched decode and remove; the command itself fails if a round leaves pages,
/// storage or allocator blocks behind, changes its tokens, or the resident set grows.
fn soak_of_20000_tokens_leaves_nothing_behind() {
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = build(mode);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .arg("generate")
            .arg(&so)
            .args(["--prompt", "1,17,42,5,33,8", "--max-new-tokens", "24", "--soak", "20000"])
            .output()
            .expect("relaxc generate --soak");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "soak ({}): {stderr}", common::mode_name(mode));
        assert!(stdout.contains("tokens were the first round's"), "{stdout}");
        assert!(stderr.contains("of 20000 tokens"), "no progress shown: {stderr}");
        eprint!("{} {stdout}", common::mode_name(mode));
    }
}

/// A C host runs prefill and decode through rvm.h alone and gets TVM's tokens; valgrind finds no
/// leak and no invalid access.
fn c_host_generates_tvms_tokens_under_valgrind() -> Option<String> {
    let exe = common::build_c_host("llm_test");
    let want = npz::read_arrays(&fixture().join("generate.npz")).expect("generate.npz");
    let (prompt, tokens) = (id_list(&want["prompt"].2), id_list(&want["tokens"].2));
    let mut skipped = None;
    let params = fixture_named("tiny_llama_params");
    let runs = [ExecMode::Bytecode, ExecMode::Compiled].into_iter().flat_map(|mode| {
        // The bound model, and the model with its weights outside (tensor cache, then
        // safetensors: both give the same tokens, loaded through rvm.h's weights_open).
        [
            (build(mode), vec![]),
            (build_named("tiny_llama_params", mode), vec!["--weights".into(), params.join("tensor-cache")]),
            (build_named("tiny_llama_params", mode), vec!["--weights".into(), params.join("params.safetensors")]),
        ]
        .into_iter()
        .map(move |(so, weights): (PathBuf, Vec<PathBuf>)| (mode, so, weights))
    });
    for (mode, so, weights) in runs {
        let out = std::process::Command::new(&exe)
            .args(&weights)
            .arg(&so)
            .arg(&prompt)
            .arg(&tokens)
            .output()
            .expect("run llm_test");
        assert!(
            out.status.success(),
            "llm_test ({} {weights:?}): {}",
            common::mode_name(mode),
            String::from_utf8_lossy(&out.stderr)
        );
        if weights.last().is_some_and(|w| w.extension().is_some_and(|e| e == "safetensors")) {
            continue; // one valgrind run of each model and mode is enough
        }
        if std::process::Command::new("valgrind").arg("--version").output().is_err() {
            assert!(std::env::var_os("CI").is_none(), "valgrind is required in CI (.ci/run installs it)");
            skipped =
                Some("valgrind run of llm_test skipped: valgrind is not installed; the native runs passed".to_string());
            continue;
        }
        let vg = std::process::Command::new("valgrind")
            .args(["--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect"])
            .arg(&exe)
            .args(&weights)
            .arg(&so)
            .arg(&prompt)
            .arg(&tokens)
            .output()
            .expect("valgrind");
        let text = String::from_utf8_lossy(&vg.stderr);
        assert!(
            vg.status.success() && text.contains("ERROR SUMMARY: 0 errors"),
            "valgrind ({}):\n{text}",
            common::mode_name(mode)
        );
    }
    skipped
}

/// `relaxc generate` prints TVM's tokens and writes TVM's logits, in both modes.
fn generate_command_matches_tvm() {
    let want = npz::read_arrays(&fixture().join("generate.npz")).expect("generate.npz");
    let prompt = id_list(&want["prompt"].2);
    let tokens = id_list(&want["tokens"].2).replace(',', " ");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let so = build(mode);
        let logits =
            common::scratch_dir().join(format!("logits.{}.{}.npz", common::mode_name(mode), std::process::id()));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .args(["generate"])
            .arg(&so)
            .args(["--prompt", &prompt, "--max-new-tokens", "16", "--logits"])
            .arg(&logits)
            .output()
            .expect("relaxc generate");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.lines().next(), Some(format!("tokens: {tokens}").as_str()));
        assert!(stdout.contains("prefill: ") && stdout.contains("tokens/s"), "{stdout}");
        let got = npz::read_arrays(&logits).expect("logits.npz");
        assert_eq!(got["logits"].1, vec![16, 64]);
        assert_eq!(got["logits"].2, want["logits"].2, "logits bit for bit ({})", common::mode_name(mode));
    }
}

fn generate_command_rejects_bad_input_clearly() {
    let so = build(ExecMode::Bytecode);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
            .arg("generate")
            .arg(&so)
            .args(args)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--prompt", "1,64"]).contains("token id 64 is outside the model's vocabulary (ids 0..63)"));
    assert!(
        run(&["--prompt", "1,2", "--max-new-tokens", "10", "--max-total-seq-len", "8"])
            .contains("more than --max-total-seq-len 8")
    );
    assert!(run(&["--prompt", "1", "--max-new-tokens", "0"]).contains("--max-new-tokens must be at least 1"));
    let mlp =
        common::build("mlp_static", &common::fixtures_dir().join("mlp_static/m.tar"), ExecMode::Bytecode).expect("mlp");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_relaxc"))
        .arg("generate")
        .arg(&mlp)
        .args(["--prompt", "1"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no create_paged_kv_cache, embed, prefill, decode"), "{err}");
}

/// Exports whose decode takes exactly one sequence (a fixed export spec) and exports with MLC's
/// batch functions: greedy generation gives TVM's tokens, a step of twelve sequences (its paged
/// attention split across the threads) gives each sequence the bits it gets alone, and the soak
/// (which decodes two sequences a step) passes.
fn exports_of_either_batch_kind_decode_many_sequences() {
    for (name, fixed) in [("tiny_llama_fixed", Some(1)), ("tiny_llama_mlc", None)] {
        let so = build_named(name, ExecMode::Compiled);
        let model = Model::load(&so).expect("load");
        let want = npz::read_arrays(&fixture_named(name).join("generate.npz")).expect("generate.npz");
        let ids = |b: &[u8]| -> Vec<i32> {
            b.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        };
        let config = CacheConfig { max_batch_size: 32, ..CacheConfig::default() };
        let mut llm = Llm::new(&model, &so, config).expect("cache");
        assert_eq!(llm.decode_batch(), fixed, "{name}: decode's batch read from its signature");
        // Twelve sequences: enough for the paged decode attention to be split across threads.
        let mut prompts = vec![ids(&want["prompt"].2), vec![4, 8, 15], vec![16, 23, 42, 7]];
        prompts.extend((0..9).map(|i| (0..3 + 2 * i).map(|k| (7 * i + 3 * k + 1) % 64).collect::<Vec<i32>>()));
        let mut last = vec![];
        for (i, p) in prompts.iter().enumerate() {
            llm.add_sequence(i as i64).expect("add");
            last.push(llm.prefill(&[i as i64], std::slice::from_ref(p)).expect("prefill").argmax(0));
        }
        let seqs: Vec<i64> = (0..prompts.len() as i64).collect();
        let together = llm.decode(&seqs, &last).expect("a step of twelve sequences");
        assert_eq!(together.rows, prompts.len());
        for (i, p) in prompts.iter().enumerate() {
            let seq = 100 + i as i64;
            llm.add_sequence(seq).expect("add");
            llm.prefill(&[seq], std::slice::from_ref(p)).expect("prefill");
            let alone = llm.decode(&[seq], &[last[i]]).expect("decode alone");
            assert!(same_bits(alone.row(0), together.row(i)), "{name}: sequence {i} decoded together vs alone");
        }
        let out = relaxc_cli()
            .arg("generate")
            .arg(&so)
            .args(["--prompt", &id_list(&want["prompt"].2), "--max-new-tokens", "16"])
            .output()
            .expect("relaxc generate");
        let tokens = id_list(&want["tokens"].2).replace(',', " ");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("tokens: {tokens}\n")), "{name}: {out:?}");
        let out = relaxc_cli()
            .arg("generate")
            .arg(&so)
            .args(["--prompt", "1,17,42", "--max-new-tokens", "8", "--soak", "500"])
            .output()
            .expect("relaxc generate --soak");
        assert!(out.status.success(), "{name}: soak: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn main() {
    common::pin_recorded_kernels();
    let args = Arguments::from_args();
    let plain: [(&str, fn()); 18] = [
        ("exports_of_either_batch_kind_decode_many_sequences", exports_of_either_batch_kind_decode_many_sequences),
        ("external_weights_give_tvms_tokens_and_logits", external_weights_give_tvms_tokens_and_logits),
        ("broken_weight_files_are_clear_errors", broken_weight_files_are_clear_errors),
        ("soak_of_20000_tokens_leaves_nothing_behind", soak_of_20000_tokens_leaves_nothing_behind),
        ("scenarios_match_tvm_bytecode", scenarios_match_tvm_bytecode),
        ("scenarios_match_tvm_compiled", scenarios_match_tvm_compiled),
        ("library_scenarios_match_tvm_bytecode", library_scenarios_match_tvm_bytecode),
        ("library_scenarios_match_tvm_compiled", library_scenarios_match_tvm_compiled),
        ("greedy_generation_matches_tvm_bytecode", greedy_generation_matches_tvm_bytecode),
        ("greedy_generation_matches_tvm_compiled", greedy_generation_matches_tvm_compiled),
        ("library_greedy_generation_matches_tvm_bytecode", library_greedy_generation_matches_tvm_bytecode),
        ("library_greedy_generation_matches_tvm_compiled", library_greedy_generation_matches_tvm_compiled),
        ("library_generation_is_close_to_tvms_default_kernels", library_generation_is_close_to_tvms_default_kernels),
        ("failing_calls_give_tvms_errors", failing_calls_give_tvms_errors),
        ("bad_input_is_a_clear_error_not_a_crash", bad_input_is_a_clear_error_not_a_crash),
        ("sliding_window_caches_are_refused_at_creation", sliding_window_caches_are_refused_at_creation),
        ("generate_command_matches_tvm", generate_command_matches_tvm),
        ("generate_command_rejects_bad_input_clearly", generate_command_rejects_bad_input_clearly),
    ];
    let mut trials = common::plain_trials(&plain);
    // A valgrind run that could not happen is reported as ignored, with the reason, not as ok.
    trials.push(Trial::ignorable_test("c_host_generates_tvms_tokens_under_valgrind", || {
        Ok(match c_host_generates_tvms_tokens_under_valgrind() {
            Some(why) => Completion::ignored_with(why),
            None => Completion::Completed,
        })
    }));
    libtest_mimic::run(&args, trials).exit();
}
