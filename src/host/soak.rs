//! A long run of an LLM (`relaxc generate --soak TOKENS`): rounds of a sequence added, prefilled
//! and decoded, forked, both decoded as a batch of two, both removed, until TOKENS tokens are generated, on
//! a VM whose every allocation is counted (`heap::CountingHeap`). After each round's removals the
//! cache's pages, the VM's storage and the allocator's live blocks must be back where the first
//! round left them, every round must produce the first round's tokens, and the resident set must
//! stay flat.

use crate::host::heap::CountingHeap;
use crate::host::llm::{CacheConfig, Llm};
use crate::host::{HostError, Model};

/// What a soak saw.
#[derive(Debug)]
pub struct SoakReport {
    pub tokens: usize,
    pub rounds: usize,
    /// Resident set after the first round, and the most seen after it (bytes).
    pub rss_after_first_round: u64,
    pub rss_max: u64,
    /// The allocator's live blocks after each round (all equal).
    pub live_blocks: i64,
}

/// Resident set size in bytes, from /proc/self/statm (0 where there is none).
pub fn resident_bytes() -> u64 {
    let page = 4096;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * page)
}

/// One round on sequences `a` and `b`: `a` prefilled and decoded alone, `b` forked from it
/// halfway, then both decoded as a batch of two. Both continue the same context, so they must
/// give the same tokens. Returns `a`'s tokens.
fn round(llm: &mut Llm, a: i64, b: i64, prompt: &[i32], steps: usize) -> Result<Vec<i32>, HostError> {
    llm.add_sequence(a)?;
    let mut last = None;
    let chunk = llm.config().prefill_chunk_size.max(1) as usize;
    for part in prompt.chunks(chunk) {
        last = Some(llm.prefill(&[a], &[part.to_vec()])?);
    }
    let first = last.ok_or_else(|| HostError::Value("the prompt is empty".into()))?;
    let mut tokens = vec![first.argmax(0)];
    let fork_at = steps / 2;
    while tokens.len() < fork_at {
        let t = tokens[tokens.len() - 1];
        tokens.push(llm.decode(&[a], &[t])?.argmax(0));
    }
    // Everything `a` holds so far (the prompt and the tokens fed back) is shared with `b`.
    llm.fork_sequence(a, b, (prompt.len() + tokens.len() - 1) as i64)?;
    while tokens.len() < steps {
        let t = tokens[tokens.len() - 1];
        let step = llm.decode(&[a, b], &[t, t])?;
        let (ta, tb) = (step.argmax(0), step.argmax(1));
        if ta != tb {
            return Err(HostError::Value(format!(
                "sequence {b}, forked from {a}, decodes {tb} where {a} decodes {ta}"
            )));
        }
        tokens.push(ta);
    }
    llm.remove_sequence(a)?;
    llm.remove_sequence(b)?;
    Ok(tokens)
}

/// Runs rounds until `total` tokens are generated; `progress(tokens so far, report)` after each
/// round. Fails at the first round that leaves anything behind.
/// What a soak generates: the prompt of every round, new tokens per sequence, the total.
pub struct SoakPlan<'a> {
    pub prompt: &'a [i32],
    pub steps: usize,
    pub total: usize,
}

pub fn soak(
    model: &Model,
    path: &std::path::Path,
    config: CacheConfig,
    plan: &SoakPlan,
    weights: Option<&crate::host::external::Weights>,
    mut progress: impl FnMut(&SoakReport),
) -> Result<SoakReport, HostError> {
    let SoakPlan { prompt, steps, total } = *plan;
    if steps < 2 {
        return Err(HostError::Value("a soak round needs at least 2 new tokens per sequence".into()));
    }
    if config.max_batch_size < 2 {
        return Err(HostError::Value(
            "a soak decodes two sequences at once: the cache needs max_batch_size 2 or more".into(),
        ));
    }
    let heap = CountingHeap::new();
    // SAFETY: the heap outlives the Llm and its VM (both dropped at the end of this block).
    let vm = unsafe { model.vm_with_allocator(heap.allocator()) }?;
    let mut llm = Llm::on_vm_with(model, vm, path, config, weights).map_err(|(e, _)| e)?;
    let pages = llm.available_pages()?;
    let mut report = SoakReport { tokens: 0, rounds: 0, rss_after_first_round: 0, rss_max: 0, live_blocks: 0 };
    let mut reference: Option<(Vec<i32>, u64)> = None;
    while report.tokens < total {
        let (a, b) = (2 * report.rounds as i64, 2 * report.rounds as i64 + 1);
        let tokens = round(&mut llm, a, b, prompt, steps)?;
        // a's tokens, and b's from the fork on
        report.tokens += tokens.len() + (steps - steps / 2);
        report.rounds += 1;
        let (live, storage, free) = (heap.live(), llm.vm_stats().live_storage_bytes, llm.available_pages()?);
        if free != pages {
            return Err(HostError::Value(format!(
                "round {}: {free} free pages after removing both sequences, {pages} at the start",
                report.rounds
            )));
        }
        match &reference {
            None => {
                reference = Some((tokens, storage));
                report.live_blocks = live;
                report.rss_after_first_round = resident_bytes();
            }
            Some((want, want_storage)) => {
                if tokens != *want {
                    return Err(HostError::Value(format!(
                        "round {}: tokens {tokens:?}, the first round gave {want:?}",
                        report.rounds
                    )));
                }
                if live != report.live_blocks || storage != *want_storage {
                    return Err(HostError::Value(format!(
                        "round {}: {live} live blocks and {storage} bytes of storage, {} and {want_storage} after the first round",
                        report.rounds, report.live_blocks
                    )));
                }
            }
        }
        report.rss_max = report.rss_max.max(resident_bytes());
        progress(&report);
    }
    drop(llm);
    if heap.live() != 0 {
        return Err(HostError::Value(format!("{} blocks never returned to the allocator", heap.live())));
    }
    Ok(report)
}
