//! LLMs from GGUF files (fixtures/gguf: a small Llama whose matrices mix f32, f16, q8_0, q4_0,
//! q4_K and q6_K, and a small Qwen2, built by relaxc.llm): `relaxc generate --weights FILE.gguf`
//! gives TVM's tokens
//! and logits bit for bit in both modes, and so does a C host through rvm.h's weights_open;
//! loading maps the file without copying its matrices; damaged files (truncated, bad offsets,
//! unknown types, missing tensors, wrong shapes, random bytes) are clear errors from the CLI and
//! from C, never crashes.

mod common;

use std::path::PathBuf;
use std::process::Command;

use relaxc::codegen::ExecMode;
use relaxc::host::npz;

fn fixture() -> PathBuf {
    common::root().join("fixtures/gguf")
}

fn gguf_file() -> PathBuf {
    fixture().join("tiny_mixed.gguf")
}

fn build(mode: ExecMode) -> PathBuf {
    common::build("gguf_tiny_mixed", &fixture().join("m.tar"), mode).expect("build the GGUF model")
}

fn relaxc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_relaxc"))
}

fn ids(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn joined(ids: &[i32], sep: &str) -> String {
    ids.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(sep)
}

/// TVM's greedy generation on the same file, reproduced bit for bit: the llama mixing every
/// format, a qwen2 (biases on Q, K and V; Hugging Face's row order), a Llama 3 (RoPE frequency
/// factors, the output tied to the embeddings), a qwen3 (per-head Q and K norms) and a phi3 (fused
/// QKV and gate-up matrices).
fn generation_gives_tvms_tokens_and_logits() {
    for (tar, gguf, recorded) in [
        ("m.tar", "tiny_mixed.gguf", "generate.npz"),
        ("qwen2.tar", "tiny_qwen2.gguf", "generate_qwen2.npz"),
        ("llama3.tar", "tiny_llama3.gguf", "generate_llama3.npz"),
        ("qwen3.tar", "tiny_qwen3.gguf", "generate_qwen3.npz"),
        ("phi3.tar", "tiny_phi3.gguf", "generate_phi3.npz"),
    ] {
        let want = npz::read_arrays(&fixture().join(recorded)).expect("recorded generation");
        let (prompt, tokens) = (ids(&want["prompt"].2), ids(&want["tokens"].2));
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let so = common::build(&format!("gguf_{gguf}"), &fixture().join(tar), mode).expect("build the GGUF model");
            let logits = common::scratch_dir().join(format!(
                "gguf_logits.{gguf}.{}.{}.npz",
                common::mode_name(mode),
                std::process::id()
            ));
            let out = relaxc()
                .arg("generate")
                .arg(&so)
                .args(["--prompt", &joined(&prompt, ","), "--max-new-tokens", "16", "--weights"])
                .arg(fixture().join(gguf))
                .arg("--logits")
                .arg(&logits)
                .output()
                .expect("relaxc generate");
            assert!(out.status.success(), "{gguf}: {}", String::from_utf8_lossy(&out.stderr));
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(stdout.lines().next(), Some(format!("tokens: {}", joined(&tokens, " ")).as_str()), "{gguf}");
            let got = npz::read_arrays(&logits).expect("logits");
            assert_eq!(got["logits"].2, want["logits"].2, "{gguf}: logits bit for bit ({})", common::mode_name(mode));
            let _ = std::fs::remove_file(&logits);
        }
    }
}

/// The same through rvm.h from C: weights_open on the GGUF file, weights_arguments per call.
fn c_host_gives_tvms_tokens() {
    let want = npz::read_arrays(&fixture().join("generate.npz")).expect("generate.npz");
    let (prompt, tokens) = (ids(&want["prompt"].2), ids(&want["tokens"].2));
    let exe = common::build_c_host("llm_test");
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let out = Command::new(&exe)
            .arg("--weights")
            .arg(gguf_file())
            .arg(build(mode))
            .args([joined(&prompt, ","), joined(&tokens[..8], ",")])
            .output()
            .expect("llm_test");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The place of a tensor's entry in the header: the byte after its name.
fn entry_after_name(file: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    file.windows(key.len()).position(|w| w == key).unwrap_or_else(|| panic!("{name} is not in the header")) + key.len()
}

/// (ndim, where the dims start, where the type is, where the offset is) of a tensor's entry.
fn entry_fields(file: &[u8], name: &str) -> (usize, usize, usize, usize) {
    let at = entry_after_name(file, name);
    let ndim = u32::from_le_bytes(file[at..at + 4].try_into().expect("4 bytes")) as usize;
    let dims = at + 4;
    let ty = dims + 8 * ndim;
    (ndim, dims, ty, ty + 4)
}

fn expect_failure(command: &mut Command, what: &str) -> String {
    let out = command.output().expect("run");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Damaged copies of the file, through the CLI and through a C host: each error names what is
/// wrong, the tensor and the file.
fn damaged_files_are_clear_errors() {
    let so = build(ExecMode::Bytecode);
    let exe = common::build_c_host("llm_test");
    let good = std::fs::read(gguf_file()).expect("read the fixture");
    type Edit = fn(&mut Vec<u8>);
    let cases: [(&str, Edit, &[&str]); 7] = [
        ("truncated", |f| f.truncate(f.len() - 5000), &["past the end", "truncated"]),
        (
            "bad_offset",
            |f| {
                let (_, _, _, offset) = entry_fields(f, "blk.0.attn_q.weight");
                f[offset..offset + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
            },
            &["blk.0.attn_q.weight", "past the end"],
        ),
        (
            "unknown_type",
            |f| {
                let (_, _, ty, _) = entry_fields(f, "blk.0.attn_k.weight");
                f[ty..ty + 4].copy_from_slice(&99u32.to_le_bytes());
            },
            &["blk.0.attn_k.weight", "unknown type 99"],
        ),
        (
            "missing",
            |f| {
                let at = entry_after_name(f, "output_norm.weight");
                f[at - 8] = b'X'; // output_norX.weight
            },
            &["output_norm.weight", "does not have"],
        ),
        (
            "wrong_shape",
            |f| {
                let (_, dims, _, _) = entry_fields(f, "token_embd.weight");
                f[dims + 8..dims + 16].copy_from_slice(&64u64.to_le_bytes()); // 64 rows instead of 128
            },
            &["token_embd.weight"],
        ),
        ("not_gguf", |f| f[0..4].copy_from_slice(b"GGUX"), &["not a GGUF file"]),
        ("bad_version", |f| f[4..8].copy_from_slice(&9u32.to_le_bytes()), &["GGUF version 9"]),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, edit, says) in cases {
        let mut file = good.clone();
        edit(&mut file);
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&path, &file).expect("write");
        let cli =
            expect_failure(relaxc().arg("generate").arg(&so).args(["--prompt", "1,2", "--weights"]).arg(&path), name);
        let c = expect_failure(Command::new(&exe).arg("--weights").arg(&path).arg(&so).args(["1,2", "3"]), name);
        for (who, err) in [("relaxc", &cli), ("C host", &c)] {
            for word in says {
                assert!(err.contains(word), "{name} ({who}): the error does not say {word:?}: {err}");
            }
            // Errors found while reading the file name it; a shape the model refuses names the parameter.
            if name != "missing" && name != "wrong_shape" {
                assert!(
                    err.contains(&format!("{name}.gguf")),
                    "{name} ({who}): the error does not name the file: {err}"
                );
            }
        }
    }
}

/// Random changes to the header (the first 4 KiB: counts, lengths, types, dims, offsets):
/// every run ends with a result or an error, never a signal.
fn mutated_headers_never_crash() {
    let so = build(ExecMode::Bytecode);
    let good = std::fs::read(gguf_file()).expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    let count: usize = std::env::var("RELAXC_FUZZ_COUNT").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..count {
        let mut file = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % 4096) as usize;
            file[at] = match next() % 3 {
                0 => next() as u8,
                1 => 0xff,
                _ => 0,
            };
        }
        let path = dir.path().join(format!("m{i}.gguf"));
        std::fs::write(&path, &file).expect("write");
        let out = relaxc()
            .arg("generate")
            .arg(&so)
            .args(["--prompt", "1,2", "--max-new-tokens", "2", "--weights"])
            .arg(&path)
            .output()
            .expect("run");
        assert!(
            out.status.code().is_some(),
            "mutation {i} ended with a signal: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// GGUF's matrices are mapped, not copied: after loading a file of 64 MiB of q4_0 matrices, all
/// of them 32 bytes off a 64-byte boundary (where other formats' weights would be copied), the
/// process holds under a tenth of the file more than before.
fn loading_maps_without_copying() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.gguf");
    let (rows, k, count) = (4096u64, 8192u64, 4u64); // each 4096 x 8192 q4_0: 18 MiB
    let row_bytes = k / 32 * 18;
    let mut header = Vec::new();
    header.extend_from_slice(b"GGUF");
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&0u64.to_le_bytes());
    let mut offset = 32u64; // tensors at 32 mod 64 from the data section's start
    for i in 0..count {
        let name = format!("m{i}.weight");
        header.extend_from_slice(&(name.len() as u64).to_le_bytes());
        header.extend_from_slice(name.as_bytes());
        header.extend_from_slice(&2u32.to_le_bytes());
        header.extend_from_slice(&k.to_le_bytes());
        header.extend_from_slice(&rows.to_le_bytes());
        header.extend_from_slice(&2u32.to_le_bytes()); // q4_0
        header.extend_from_slice(&offset.to_le_bytes());
        offset += (rows * row_bytes).div_ceil(64) * 64 + 32;
    }
    header.resize(header.len().div_ceil(64) * 64, 0); // the data section 64-aligned in the file
    std::fs::write(&path, &header).expect("write the header");
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    file.set_len(header.len() as u64 + offset).expect("size the file");
    drop(file);
    let model = relaxc::host::Model::load(&build(ExecMode::Bytecode)).expect("load the model");
    let before = relaxc::host::soak::resident_bytes();
    let weights = relaxc::host::external::Weights::load(&model, &path).expect("load the GGUF file");
    let grown = relaxc::host::soak::resident_bytes().saturating_sub(before);
    let size = std::fs::metadata(&path).expect("size").len();
    assert!(grown < size / 10, "loading {size} bytes of GGUF grew the process by {grown} bytes");
    drop(weights);
}

fn main() {
    common::pin_recorded_kernels();
    let args = libtest_mimic::Arguments::from_args();
    let plain: [(&str, fn()); 5] = [
        ("generation_gives_tvms_tokens_and_logits", generation_gives_tvms_tokens_and_logits),
        ("c_host_gives_tvms_tokens", c_host_gives_tvms_tokens),
        ("damaged_files_are_clear_errors", damaged_files_are_clear_errors),
        ("mutated_headers_never_crash", mutated_headers_never_crash),
        ("loading_maps_without_copying", loading_maps_without_copying),
    ];
    libtest_mimic::run(&args, common::plain_trials(&plain)).exit();
}
