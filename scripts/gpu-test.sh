#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: configure and build with the CUDA backend on, run the GPU tests (CTest label gpu)
# and the GPU benchmarks, and write every log and figure into OUTDIR. Exits non-zero when a GPU test fails or
# is skipped (a skip here means the GPU was not usable). Usage: scripts/gpu-test.sh OUTDIR [BUILD_DIR]
set -euo pipefail

OUT=${1:?usage: scripts/gpu-test.sh OUTDIR [BUILD_DIR]}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=${2:-$ROOT/build-gpu}
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 ||
    echo "nvidia-smi: unavailable"
  nvcc --version | tail -1
} | tee "$OUT/machine.txt"

start=$(date +%s)
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOECORE_BUILD_TESTS=ON -DMOECORE_CUDA=ON \
  >"$OUT/configure.log" 2>&1
cmake --build "$BUILD" -j"$(nproc)" --target moecore moecore_cuda_tests moecore_tests >"$OUT/build.log" 2>&1
echo "build: $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"

# The GPU tests: every one must run (a skip means no usable GPU) and pass.
status=0
"$BUILD/moecore_cuda_tests" --gtest_output="json:$OUT/gpu_tests.json" 2>&1 | tee "$OUT/gpu_tests.log" || status=1
if grep -q "\[  SKIPPED \]" "$OUT/gpu_tests.log"; then
  echo "gpu-test: GPU tests were skipped: no usable GPU" | tee -a "$OUT/gpu_tests.log"
  status=1
fi
# The host-side CUDA tests (allocator bookkeeping, --device) under the CUDA build.
"$BUILD/moecore_tests" --gtest_filter='CachingAllocator.*:DeviceSelect.*:DeviceTensor.*' >"$OUT/host_tests.log" 2>&1 ||
  status=1

# Benchmarks (figures for docs/performance.md and docs/cuda.md).
M="$BUILD/moecore"
run_bench() {
  local name=$1
  shift
  echo "\$ moecore $*" >"$OUT/bench_$name.txt"
  "$M" "$@" >>"$OUT/bench_$name.txt" 2>&1 || { echo "bench $name failed" >>"$OUT/bench_$name.txt"; status=1; }
}
run_bench gemm_2048 bench gemm --device cuda --size 2048 --iters 20
run_bench gemm_8192 bench gemm --device cuda --size 8192 --iters 10
run_bench attention_f32 bench attention --device cuda --seq-length 4096 --num-attention-heads 16 \
  --num-query-groups 16 --kv-channels 128 --iters 5
run_bench attention_bf16 bench attention --device cuda --dtype bf16 --seq-length 4096 --num-attention-heads 16 \
  --num-query-groups 16 --kv-channels 128 --iters 5
# GPU training is refused until the modules allocate on the GPU (docs/cuda.md): record the refusal.
"$M" bench train --device cuda --iters 1 >"$OUT/bench_train.txt" 2>&1 || true

if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 - >"$OUT/pytorch_sdpa.txt" 2>&1 <<'PY' || true
import time, torch
import torch.nn.functional as F
for dt in (torch.float32, torch.bfloat16):
    q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True); v = torch.randn_like(q, requires_grad=True)
    do = torch.randn_like(q)
    for i in range(6):
        torch.cuda.synchronize(); t = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True); o.backward(do)
        torch.cuda.synchronize(); dt_s = time.perf_counter() - t
    fl = 3.5 * 4.0 * 4096 * 4096 * 128 * 16 / 2
    print(f"pytorch sdpa {dt} S=4096 heads=16 D=128 causal fwd+bwd: {fl / dt_s / 1e9:.1f} GFLOP/s")
PY
fi
echo "gpu-test: logs and figures in $OUT (status $status)"
exit $status
