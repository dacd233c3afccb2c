#!/usr/bin/env bash
# Issue 25's CPU benchmarks, two moecore binaries alternating (so a host whose speed drifts treats both alike), on
# two threads pinned to cores 0-1, then the new binary alone: attention with training's dropout, and its kernel choices
# against each other: the native attention's AMX products against AVX512-BF16 (MOECORE_NATIVE_BF16) and packed expert
# weights (MOECORE_PACK_WEIGHTS=on).
# Usage: scripts/cpu-ab.sh BASE_BINARY NEW_BINARY [OUTDIR]   (OUTDIR: ab.txt and variants.txt; default: stdout)
# On an AMX host, run it where the bf16 GEMM peak is steady; each benchmark prints its peak samples, and a warning
# when they differ.
set -uo pipefail
BASE=${1:?usage: scripts/cpu-ab.sh BASE_BINARY NEW_BINARY [OUTDIR]}
NEW=${2:?usage: scripts/cpu-ab.sh BASE_BINARY NEW_BINARY [OUTDIR]}
OUT=${3:-}
run() { env OMP_NUM_THREADS=2 taskset -c 0,1 timeout 120 "$@" 2>&1; }
keep='error|^train|^moe_layer|^attention d|machine:|GEMMs:|a run:|norms|cross-entropy|optimizer \(|attention kernels|activations|dropout|peak samples differ|GEMM peak|each run against'
att=(--dtype bf16 --bf16-tensors --seq-length 256 --micro-batch-size 4 --num-attention-heads 16 --num-query-groups 4
  --iters 10)
ab() {
  for i in 1 2 3; do for b in "$BASE" "$NEW"; do echo "== train bf16 $b"; run "$b" bench train --device cpu --dtype bf16 --iters 3 | grep -E "$keep"; done; done
  for i in 1 2; do for b in "$BASE" "$NEW"; do echo "== moe-layer bf16 $b"; run "$b" bench moe-layer --device cpu --dtype bf16 --iters 3 | grep -E "$keep"; done; done
  for i in 1 2; do for b in "$BASE" "$NEW"; do echo "== attention (train's shape) $b"; run "$b" bench attention --device cpu "${att[@]}" | grep -E "$keep"; done; done
}
variants() {
  for i in 1 2; do echo "== attention (train's shape) with training's dropout 0.1"; run "$NEW" bench attention --device cpu "${att[@]}" --attention-dropout 0.1 | grep -E "$keep"; done
  for i in 1 2; do for n in amx avx512bf16; do echo "== attention (train's shape) MOECORE_NATIVE_BF16=$n"; MOECORE_NATIVE_BF16=$n run "$NEW" bench attention --device cpu "${att[@]}" | grep -E "$keep"; done; done
  for i in 1 2; do for w in auto on; do echo "== moe-layer bf16 MOECORE_PACK_WEIGHTS=$w"; MOECORE_PACK_WEIGHTS=$w run "$NEW" bench moe-layer --device cpu --dtype bf16 --iters 3 | grep -E "$keep"; done; done
  for w in auto on; do echo "== train bf16 MOECORE_PACK_WEIGHTS=$w"; MOECORE_PACK_WEIGHTS=$w run "$NEW" bench train --device cpu --dtype bf16 --iters 3 | grep -E "$keep"; done
}
if [[ -n "$OUT" ]]; then
  mkdir -p "$OUT" && ab > "$OUT/ab.txt" && variants > "$OUT/variants.txt"
else
  ab && variants
fi
