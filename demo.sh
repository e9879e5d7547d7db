#!/usr/bin/env bash
# The main job on a bundled model: compile TVM's export of a small MLP (constant weights,
# matmul/add/relu kernels built by TVM's LLVM backend) into one self-contained .so, show what is
# in it, run it from its C API, and check the results against TVM's own, bit for bit.
set -euo pipefail
cd "$(dirname "$0")"
cargo build --release --quiet
relaxc=./target/release/relaxc
out=${TMPDIR:-/tmp}/relaxc-demo
mkdir -p "$out"
model=fixtures/tvm/mlp_static

echo "== relaxc compile $model/m.tar"
$relaxc compile "$model/m.tar" -o "$out/mlp.so" --verbose
ls -l "$out/mlp.so"
echo "== exported symbols and dependencies"
nm -D --defined-only "$out/mlp.so"
readelf -d "$out/mlp.so" | grep NEEDED
echo "== relaxc inspect (the listing TVM's as_text() prints)"
$relaxc inspect "$out/mlp.so"
echo "== relaxc run"
$relaxc run "$out/mlp.so" --inputs "$model/ok_basic.in.npz" --outputs "$out/out.npz" \
  --expect "$model/ok_basic.out.npz" --stats --bench 10000
