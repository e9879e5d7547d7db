#!/usr/bin/env bash
# The main job on a bundled model: compile TVM's export of a small MLP (constant weights,
# matmul/add/relu kernels built by TVM's LLVM backend) into one self-contained .so in both
# execution modes (the bytecode interpreter and Cranelift-compiled native code), show what is in
# it, run both from their C API, check each against TVM's own results bit for bit and against
# each other, and time them side by side.
set -euo pipefail
cd "$(dirname "$0")"
echo "== building relaxc (cargo build --release; a fresh checkout takes a few minutes)"
cargo build --release
relaxc=./target/release/relaxc
out=${TMPDIR:-/tmp}/relaxc-demo
mkdir -p "$out"
model=fixtures/tvm/mlp_static

for mode in bytecode compiled; do
  echo "== relaxc compile $model/m.tar --exec-mode $mode"
  $relaxc compile "$model/m.tar" --exec-mode "$mode" -o "$out/mlp.$mode.so" --verbose
  ls -l "$out/mlp.$mode.so"
done
echo "== exported symbols and dependencies (compiled mode)"
nm -D --defined-only "$out/mlp.compiled.so"
readelf -d "$out/mlp.compiled.so" | grep NEEDED
echo "== relaxc inspect (the listing TVM's as_text() prints, and how each function runs)"
$relaxc inspect "$out/mlp.compiled.so"

declare -A median
for mode in bytecode compiled; do
  echo "== relaxc run ($mode): results against TVM's, then 10000 timed calls"
  log=$($relaxc run "$out/mlp.$mode.so" --inputs "$model/ok_basic.in.npz" --outputs "$out/out.$mode.npz" \
    --expect "$model/ok_basic.out.npz" --stats --bench 10000)
  echo "$log"
  median[$mode]=$(echo "$log" | sed -n 's/.*median \([0-9.]*\) us.*/\1/p')
done
echo "== the two modes against each other"
$relaxc run "$out/mlp.compiled.so" --inputs "$model/ok_basic.in.npz" --expect "$out/out.bytecode.npz" | head -1

echo "== side by side (median per call, in-process)"
printf '| %-10s | %14s |\n' mode "us per call"
printf '|%s|%s|\n' "------------" "----------------"
for mode in bytecode compiled; do
  printf '| %-10s | %14s |\n' "$mode" "${median[$mode]}"
done
