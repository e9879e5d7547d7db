//! `relaxc generate`: greedy generation with an LLM on the paged KV cache, its timing, and the
//! long run (`--soak`) that checks a model leaves nothing behind round after round.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use relaxc::host::{Model, npz};

use super::{positive_count, refuse_overwriting};

#[derive(clap::Args)]
pub struct Args {
    /// A model built by `relaxc compile` from an LLM export.
    model: PathBuf,
    /// The prompt: token ids, comma-separated (e.g. 1,17,42), or with --tokenizer the text
    /// itself (e.g. "Once upon a time").
    #[arg(long, required = true)]
    prompt: String,
    /// Hugging Face's tokenizer.json for the model (`python -m relaxc.llm build` writes one
    /// beside the model): --prompt is text, encoded with the tokenizer's special tokens, and the
    /// new tokens are printed as text while they are generated.
    #[arg(long, value_name = "tokenizer.json")]
    tokenizer: Option<PathBuf>,
    /// How many tokens to generate at most. With --tokenizer, generation also stops at the
    /// tokenizer's end-of-sequence token (its `eos_token`, from NAME.tokenizer_config.json or
    /// tokenizer_config.json beside it), unless --ignore-eos.
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    /// With --tokenizer, generate --max-new-tokens tokens even past the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Write the logits of every new token to this .npz, as float32 [N, vocab] under `logits`.
    #[arg(long, value_name = "FILE.npz")]
    logits: Option<PathBuf>,
    /// Repeat the generation (after a warm-up run) and report median timings.
    #[arg(long, value_name = "RUNS", num_args = 0..=1, default_missing_value = "10", value_parser = positive_count)]
    bench: Option<usize>,
    /// KV cache: the most tokens held at once, prompt and new tokens included.
    #[arg(long, default_value_t = 2048)]
    max_total_seq_len: i64,
    /// KV cache: the most tokens one prefill step takes; longer prompts go in chunks.
    #[arg(long, default_value_t = 256)]
    prefill_chunk_size: i64,
    /// KV cache: tokens per page (TVM's TIR attention kernels need 16).
    #[arg(long, default_value_t = 16)]
    page_size: i64,
    /// KV cache: sequences decoded together at most (generate uses one).
    #[arg(long, default_value_t = 1)]
    max_batch_size: i64,
    /// The vocabulary size, when it cannot be read from the model's embedding table.
    #[arg(long)]
    vocab_size: Option<usize>,
    /// A long run instead: generate TOKENS tokens in rounds (a sequence added and prefilled
    /// with the prompt, decoded for --max-new-tokens, forked halfway, both decoded as a batch,
    /// both removed) on a VM whose allocations are counted. Fails if a round leaves pages,
    /// storage or allocator blocks behind, or gives other tokens than the first round;
    /// reports the resident set.
    #[arg(long, value_name = "TOKENS")]
    soak: Option<usize>,
    /// Weights for a model exported with its weights as parameters: a tensor cache
    /// (a directory with tensor-cache.json or ndarray-cache.json and its shards), safetensors
    /// (a file, or a directory of shards) or GGUF (a .gguf file, for models built by
    /// `python -m relaxc.llm build`). Memory-mapped; each weight parameter is matched by name.
    #[arg(long, value_name = "PATH")]
    weights: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let Args {
        model,
        prompt,
        max_new_tokens,
        logits,
        bench,
        max_total_seq_len,
        prefill_chunk_size,
        page_size,
        max_batch_size,
        vocab_size,
        soak,
        weights,
        tokenizer,
        ignore_eos,
    } = args;
    let (tokenizer, end) = match tokenizer {
        None => (None, None),
        Some(path) => {
            let t = tokenizers::Tokenizer::from_file(&path).map_err(|e| {
                anyhow::anyhow!("--tokenizer {}: not a tokenizer.json that can be read: {e}", path.display())
            })?;
            let text = if ignore_eos { None } else { end_of_sequence(&path)? };
            let end = text
                .map(|text| {
                    t.token_to_id(&text).map(|id| id as i32).with_context(|| {
                        format!("the end-of-sequence token {text:?} is not in the tokenizer's vocabulary")
                    })
                })
                .transpose()?;
            (Some(t), end)
        }
    };
    let prompt = match &tokenizer {
        Some(t) => {
            let encoding =
                t.encode(prompt.as_str(), true).map_err(|e| anyhow::anyhow!("--prompt: cannot encode it: {e}"))?;
            if encoding.get_ids().is_empty() {
                bail!("--prompt {prompt:?} encodes to no tokens with this tokenizer");
            }
            encoding.get_ids().iter().map(|&id| id as i32).collect()
        }
        None => prompt.split(',').map(|t| t.trim().parse::<i32>()).collect::<Result<Vec<i32>, _>>().map_err(|_| {
            anyhow::anyhow!(
                "--prompt {prompt:?}: without --tokenizer a prompt is token ids, comma-separated (e.g. 1,17,42)"
            )
        })?,
    };
    let config = relaxc::host::llm::CacheConfig { max_batch_size, max_total_seq_len, prefill_chunk_size, page_size };
    if let Some(total) = soak {
        if logits.is_some() || bench.is_some() {
            bail!("--soak runs alone: it takes neither --logits nor --bench");
        }
        return soak_run(&model, config, &prompt, max_new_tokens, total, weights.as_deref());
    }
    if let Some(out) = &logits {
        refuse_overwriting("--logits", out, &[&model])?;
    }
    let opts = GenerateOptions { prompt, max_new_tokens, logits, bench, config, vocab_size, weights, tokenizer, end };
    generate(&model, &opts)
}

/// The end-of-sequence token's text from the tokenizer's configuration: NAME.tokenizer_config.json
/// beside NAME.tokenizer.json (as `python -m relaxc.llm build` writes them), else
/// tokenizer_config.json in the same folder (as Hugging Face's repositories hold it); None when
/// there is neither or it names none.
fn end_of_sequence(tokenizer: &Path) -> Result<Option<String>> {
    let folder = tokenizer.parent().unwrap_or(Path::new("."));
    let name = tokenizer.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let mut candidates = Vec::new();
    if let Some(stem) = name.strip_suffix("tokenizer.json").filter(|s| s.ends_with('.')) {
        candidates.push(folder.join(format!("{stem}tokenizer_config.json")));
    }
    candidates.push(folder.join("tokenizer_config.json"));
    let Some(config) = candidates.into_iter().find(|c| c.is_file()) else { return Ok(None) };
    let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    // eos_token is a string, or an object with its text under "content" (Hugging Face's AddedToken).
    Ok(match json.get("eos_token") {
        Some(serde_json::Value::String(t)) => Some(t.clone()),
        Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    })
}

/// `generate --soak`: the long run of `relaxc::host::soak`, with progress every tenth of it.
fn soak_run(
    path: &Path,
    mut config: relaxc::host::llm::CacheConfig,
    prompt: &[i32],
    steps: usize,
    total: usize,
    weights: Option<&Path>,
) -> Result<()> {
    let model = Model::load(path)?;
    let weights = weights.map(|p| relaxc::host::external::Weights::load(&model, p)).transpose()?;
    config.max_batch_size = config.max_batch_size.max(2);
    let start = Instant::now();
    let mut next = total / 10;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let plan = relaxc::host::soak::SoakPlan { prompt, steps, total };
    let report = relaxc::host::soak::soak(&model, path, config, &plan, weights.as_ref(), |r| {
        if r.tokens >= next {
            eprintln!(
                "soak: {} of {total} tokens, {} rounds, RSS {:.1} MiB, {} live allocator blocks",
                r.tokens,
                r.rounds,
                mib(relaxc::host::soak::resident_bytes()),
                r.live_blocks
            );
            next += (total / 10).max(1);
        }
    })
    .context("soak")?;
    let growth = report.rss_max.saturating_sub(report.rss_after_first_round);
    println!(
        "soak: {} tokens in {} rounds ({:.1} s); after every round the pages, the storage ({} live allocator blocks) and the tokens were the first round's; RSS {:.1} MiB after the first round, at most {:.1} MiB (+{:.2} MiB)",
        report.tokens,
        report.rounds,
        start.elapsed().as_secs_f64(),
        report.live_blocks,
        mib(report.rss_after_first_round),
        mib(report.rss_max),
        mib(growth)
    );
    // Flat: the allocator's count is exact; the resident set may move by what libc keeps.
    if growth > 4 << 20 {
        bail!("the resident set grew by {:.1} MiB after the first round", mib(growth));
    }
    Ok(())
}

struct GenerateOptions {
    prompt: Vec<i32>,
    max_new_tokens: usize,
    logits: Option<PathBuf>,
    bench: Option<usize>,
    config: relaxc::host::llm::CacheConfig,
    vocab_size: Option<usize>,
    weights: Option<PathBuf>,
    tokenizer: Option<tokenizers::Tokenizer>,
    /// The token that ends generation before --max-new-tokens (text mode).
    end: Option<i32>,
}

/// One greedy generation: the new tokens, their logits, the prefill time and the decode time.
struct Generation {
    tokens: Vec<i32>,
    logits: Vec<f32>,
    vocab: usize,
    prefill: std::time::Duration,
    decode: std::time::Duration,
}

/// Calls `on_token` with each new token as it is chosen.
fn generate_once(
    model: &Model,
    path: &Path,
    opts: &GenerateOptions,
    weights: Option<&relaxc::host::external::Weights>,
    on_token: &mut dyn FnMut(i32) -> Result<()>,
) -> Result<Generation> {
    use relaxc::host::llm::Llm;
    let mut llm = Llm::with_weights(model, path, opts.config, weights)?;
    if opts.vocab_size.is_some() {
        llm.vocab = opts.vocab_size;
    }
    llm.add_sequence(0)?;
    let start = Instant::now();
    let chunk = opts.config.prefill_chunk_size.max(1) as usize;
    let mut last = None;
    for part in opts.prompt.chunks(chunk) {
        last = Some(llm.prefill(&[0], &[part.to_vec()]).context("prefill")?);
    }
    let first = last.context("the prompt is empty")?;
    let prefill = start.elapsed();
    let vocab = first.vocab;
    let mut tokens = vec![first.argmax(0)];
    on_token(tokens[0])?;
    let mut logits = first.row(0).to_vec();
    let start = Instant::now();
    while tokens.len() < opts.max_new_tokens && opts.end.is_none_or(|end| tokens.last() != Some(&end)) {
        let step = llm.decode(&[0], &[*tokens.last().context("no token")?]).context("decode")?;
        tokens.push(step.argmax(0));
        on_token(step.argmax(0))?;
        logits.extend_from_slice(step.row(0));
    }
    Ok(Generation { tokens, logits, vocab, prefill, decode: start.elapsed() })
}

fn generate(path: &Path, opts: &GenerateOptions) -> Result<()> {
    if opts.prompt.is_empty() {
        bail!("--prompt needs at least one token id");
    }
    if opts.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let needed = opts.prompt.len() as i64 + opts.max_new_tokens as i64;
    if needed > opts.config.max_total_seq_len {
        bail!(
            "the prompt ({} tokens) and {} new tokens need {needed} tokens of KV cache, more than --max-total-seq-len {}",
            opts.prompt.len(),
            opts.max_new_tokens,
            opts.config.max_total_seq_len
        );
    }
    let model = Model::load(path)?;
    let weights = opts.weights.as_deref().map(|p| relaxc::host::external::Weights::load(&model, p)).transpose()?;
    let run = match &opts.tokenizer {
        None => generate_once(&model, path, opts, weights.as_ref(), &mut |_| Ok(()))?,
        Some(tokenizer) => {
            let ids: Vec<String> = opts.prompt.iter().map(|t| t.to_string()).collect();
            println!("prompt tokens: {}", ids.join(" "));
            // Streamed: a character whose bytes span tokens is printed once it is whole.
            let mut stream = tokenizer.decode_stream(true);
            let mut out = std::io::stdout();
            let run = generate_once(&model, path, opts, weights.as_ref(), &mut |t| {
                let text = stream.step(t as u32).map_err(|e| anyhow::anyhow!("detokenizing token {t}: {e}"))?;
                if let Some(text) = text {
                    use std::io::Write;
                    out.write_all(text.as_bytes())?;
                    out.flush()?;
                }
                Ok(())
            })?;
            println!();
            run
        }
    };
    let tokens: Vec<String> = run.tokens.iter().map(|t| t.to_string()).collect();
    println!("tokens: {}", tokens.join(" "));
    let (mut prefill, mut decode) = (run.prefill, run.decode);
    if let Some(runs) = opts.bench {
        let (mut p, mut d) = (Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let again = generate_once(&model, path, opts, weights.as_ref(), &mut |_| Ok(()))?;
            if again.tokens != run.tokens {
                bail!("a repeated generation gave different tokens");
            }
            p.push(again.prefill);
            d.push(again.decode);
        }
        p.sort();
        d.sort();
        (prefill, decode) = (p[p.len() / 2], d[d.len() / 2]);
    }
    let steps = run.tokens.len().saturating_sub(1);
    let what = if opts.bench.is_some() { "median " } else { "" };
    println!("prefill: {what}{:.3} ms for {} prompt tokens", prefill.as_secs_f64() * 1e3, opts.prompt.len());
    if steps > 0 {
        println!(
            "decode: {what}{:.1} tokens/s ({:.1} us per token, {steps} steps)",
            steps as f64 / decode.as_secs_f64(),
            decode.as_secs_f64() * 1e6 / steps as f64
        );
    }
    if let Some(out) = &opts.logits {
        let data: Vec<u8> = run.logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let array = relaxc::host::Output::Tensor {
            dtype: relaxc::abi::DLDataType { code: 2, bits: 32, lanes: 1 },
            shape: vec![run.tokens.len() as i64, run.vocab as i64],
            data,
        };
        npz::write_named(out, &[("logits".to_string(), &array)])?;
    }
    Ok(())
}
