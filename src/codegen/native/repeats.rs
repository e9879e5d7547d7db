//! Finding the runs of a function that repeat, so that compiled mode can write one copy of the
//! repeated code inside a loop instead of one copy per repetition. At thousands of call sites a
//! straight line of calls runs 1.2-1.5 times slower than the same calls from a loop on Zen 3
//! (more call sites than the branch predictor tracks), and every copy is code streamed through
//! the instruction cache. The lowering gives each instruction a key that stands for the code it
//! becomes from a given frame state (`Lowering::plan_calls`), so a run here is a stretch whose
//! keys repeat with some period; `Lowering` then checks that the frame state repeats too before
//! it rolls the run.

/// Fewest repetitions worth a loop: below this the counter and the branch buy little code.
pub const MIN_REPEATS: usize = 8;

/// Longest repeated group of instructions looked for.
pub const MAX_PERIOD: usize = 64;

/// Iterations of a run at most written out before its loop, waiting for the frame state at the
/// start of an iteration to repeat.
pub const MAX_WARMUP: usize = 3;

/// `repeats` copies of the `period` instructions that start at `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: usize,
    pub period: usize,
    pub repeats: usize,
}

impl Run {
    /// The index just past the run.
    pub fn end(&self) -> usize {
        self.start + self.period * self.repeats
    }
}

/// The runs in `keys` (None: the instruction can be in no run), in order and disjoint. From each
/// position the period whose run covers the most instructions wins (the shortest on a tie);
/// where no period repeats [`MIN_REPEATS`] times, the search moves on one instruction.
pub fn find_runs(keys: &[Option<u32>]) -> Vec<Run> {
    let n = keys.len();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        let mut best: Option<Run> = None;
        for period in 1..=MAX_PERIOD.min((n - i) / MIN_REPEATS) {
            // keys[i..i + matched + period] repeat with this period.
            let mut matched = 0;
            while i + matched + period < n
                && keys[i + matched].is_some()
                && keys[i + matched] == keys[i + matched + period]
            {
                matched += 1;
            }
            let repeats = (matched + period) / period;
            let covers = |r: &Run| r.period * r.repeats;
            let candidate = Run { start: i, period, repeats };
            if repeats >= MIN_REPEATS && best.is_none_or(|b| covers(&candidate) > covers(&b)) {
                best = Some(candidate);
            }
        }
        match best {
            Some(run) => {
                runs.push(run);
                i = run.end();
            }
            None => i += 1,
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pattern: &[u32], times: usize, before: &[u32], after: &[u32]) -> Vec<Option<u32>> {
        let body = pattern.iter().copied().cycle().take(pattern.len() * times);
        before.iter().copied().chain(body).chain(after.iter().copied()).map(Some).collect()
    }

    #[test]
    fn a_chain_of_two_alternating_operators_is_one_run() {
        // alloc, call, kill on one buffer, then on the other: period 6.
        let k = keys(&[1, 2, 3, 4, 5, 3], 50, &[9, 8], &[7]);
        assert_eq!(find_runs(&k), [Run { start: 2, period: 6, repeats: 50 }]);
    }

    #[test]
    fn the_shortest_period_wins_and_a_partial_tail_stays_out() {
        // 20 copies of [1, 1] are 40 copies of [1]; then half a copy of [1, 2].
        let k = keys(&[1], 40, &[], &[2]);
        assert_eq!(find_runs(&k), [Run { start: 0, period: 1, repeats: 40 }]);
        let k = keys(&[1, 2], 10, &[], &[1]);
        assert_eq!(find_runs(&k), [Run { start: 0, period: 2, repeats: 10 }]);
    }

    #[test]
    fn too_few_repeats_or_a_gap_make_no_run() {
        assert!(find_runs(&keys(&[1, 2, 3], MIN_REPEATS - 1, &[], &[])).is_empty());
        let mut k = keys(&[1, 2], 20, &[], &[]);
        k[3] = None; // an instruction that can be in no run, e.g. a block's first
        assert_eq!(find_runs(&k), [Run { start: 4, period: 2, repeats: 18 }]);
        k[21] = None; // splits the rest into 8 and 9 copies: one run each
        assert_eq!(find_runs(&k), [Run { start: 4, period: 2, repeats: 8 }, Run { start: 22, period: 2, repeats: 9 }]);
        assert!(find_runs(&[None; 40]).is_empty());
    }

    #[test]
    fn separate_runs_are_found_in_order() {
        let mut k = keys(&[1, 2], 10, &[], &[5]);
        k.extend(keys(&[3], 9, &[], &[]));
        assert_eq!(find_runs(&k), [Run { start: 0, period: 2, repeats: 10 }, Run { start: 21, period: 1, repeats: 9 }]);
    }
}
