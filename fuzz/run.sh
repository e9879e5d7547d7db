#!/usr/bin/env bash
# Runs one libFuzzer target on stable Rust: fuzz/run.sh TARGET [SECONDS] (default 3600).
#
# cargo-fuzz passes rustc flags only nightly accepts (-Zsanitizer=address and friends);
# RUSTC_BOOTSTRAP=1 lets the stable compiler accept them, for this build only. The corpus grows in
# fuzz/corpus/TARGET (the committed, minimized corpus is where it starts); the first run also
# seeds it from the fixtures. A crash leaves its input in fuzz/artifacts/TARGET and fails the run.
#
# Targets: import_blob, parse_script, assemble, npz, safetensors, differential, rpc_packet, gguf.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:?usage: fuzz/run.sh TARGET [SECONDS]}
seconds=${2:-3600}
case "$target" in
  import_blob | parse_script | assemble | npz | safetensors | differential | rpc_packet | gguf) ;;
  *) echo "fuzz/run.sh: unknown target '$target' (import_blob, parse_script, assemble, npz, safetensors, differential, rpc_packet, gguf)" >&2; exit 2 ;;
esac

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz/run.sh: installing cargo-fuzz from crates.io" >&2
  cargo install -q cargo-fuzz --locked
fi

corpus=fuzz/corpus/$target
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
mkdir -p "$corpus"
# Seeds from the fixtures only while the corpus is empty (the committed corpus already has them).
[ -n "$(ls -A "$corpus")" ] && seed_from=none || seed_from=$target
case "$seed_from" in
  parse_script) for f in fixtures/script/*/m.py; do cp "$f" "$seeds/$(basename "$(dirname "$f")").py"; done ;;
  npz) find fixtures -name '*.npz' -size -64k | head -40 | while read -r f; do cp "$f" "$seeds/$(echo "$f" | tr / _)"; done ;;
  safetensors) find fixtures -name '*.safetensors' -exec cp {} "$seeds/" \; ;;
  import_blob | assemble)
    # The fixtures' executables, as bytes (import_blob) or as text (assemble), through relaxc.
    cargo build -q --release
    for tar in fixtures/tvm/*/m.tar; do
      name=$(basename "$(dirname "$tar")")
      if [ "$target" = assemble ]; then
        target/release/relaxc inspect --asm "$tar" >"$seeds/$name.rvmasm" 2>/dev/null || true
      else
        # The library blob is devc.o's .rodata.
        tar -xOf "$tar" devc.o >"$seeds/$name.o" 2>/dev/null &&
          objcopy -O binary --only-section=.rodata "$seeds/$name.o" "$seeds/$name.blob" || true
        rm -f "$seeds/$name.o"
      fi
    done ;;
  differential) head -c 64 /dev/urandom >"$seeds/random" ;;
  rpc_packet) python3 fuzz/rpc_seeds.py "$seeds" ;;
  # The fixture's header and first tensors, and the whole file.
  gguf) head -c 8192 fixtures/gguf/tiny_mixed.gguf >"$seeds/head.gguf"; cp fixtures/gguf/tiny_mixed.gguf "$seeds/" ;;
  none) ;;
esac

# A short run (CI's smoke test) starts from a sample of the corpus in a scratch directory:
# libFuzzer replays a whole corpus before its time limit applies, which for `differential` (two
# builds per input) takes minutes, and a smoke test should not grow the committed corpus.
if [ "$seconds" -lt 300 ] && [ -n "$(ls -A "$corpus")" ]; then
  sample=$(mktemp -d)
  trap 'rm -rf "$seeds" "$sample"' EXIT
  find "$corpus" -type f | sort | awk 'NR % 25 == 1 && n++ < 40' | xargs -r cp -t "$sample"
  corpus=$sample
fi

export RUSTC_BOOTSTRAP=1
# -O: optimized build with debug assertions; -rss_limit_mb: an input that needs more is a bug.
cargo fuzz run -O "$target" "$corpus" "$seeds" -- \
  -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=60 -print_final_stats=1
