#!/usr/bin/env bash
# The long run of issue 21 at full length: `relaxc generate --soak` over the tiny Llama in both
# modes (CI runs 20,000 tokens in tests/llm.rs, 0.6 s per mode on a 2-core VM; this runs TOKENS,
# default 2,000,000, so about a minute per mode by that rate). Each round adds a sequence,
# prefills the prompt, decodes, forks it halfway, decodes both as a batch and removes both; relaxc fails the run if a round
# leaves KV-cache pages, storage or allocator blocks behind, changes its tokens, or the resident
# set grows by more than 4 MiB after the first round.
#
# usage: bench/soak.sh [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-2000000}
cargo build --release -q
for mode in bytecode compiled; do
  so=$(mktemp --suffix=.so)
  ./target/release/relaxc compile fixtures/tvm/tiny_llama/m.tar --exec-mode "$mode" -o "$so"
  echo "== $mode"
  ./target/release/relaxc generate "$so" --prompt 1,17,42,5,33,8 --max-new-tokens 24 --soak "$tokens"
  rm -f "$so"
done
