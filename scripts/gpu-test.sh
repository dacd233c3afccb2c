#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: configure and build with the CUDA backend on, run the GPU tests (CTest label gpu)
# and the GPU benchmarks, and write every log and figure into OUTDIR. Exits non-zero when a GPU test fails or
# is skipped (a skip here means the GPU was not usable).
# Usage: scripts/gpu-test.sh OUTDIR [BUILD_DIR | --prebuilt PACK_DIR]
# --prebuilt runs the binaries of a pack made by scripts/gpu-pack.sh (for GPU machines without Debian's packages).
set -euo pipefail

OUT=${1:?usage: scripts/gpu-test.sh OUTDIR [BUILD_DIR | --prebuilt PACK_DIR]}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PREBUILT=""
if [[ "${2:-}" == "--prebuilt" ]]; then
  PREBUILT=${3:?--prebuilt needs the folder the pack was unpacked into}
  # shellcheck disable=SC1091
  source "$PREBUILT/env.sh"
  BUILD="$PREBUILT/bin"
else
  BUILD=${2:-$ROOT/build-gpu}
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# cuDNN's fused attention loads libcudnn.so.9 at run time (dlopen; nothing links it, so every binary starts without
# it). The GPU machines have cuDNN only in PyTorch's wheel (site-packages/nvidia/cudnn/lib): that folder goes on
# LD_LIBRARY_PATH, after anything already there. Without it the attention runs the native kernels and says why once,
# and the cuDNN tests (CudaAttentionCudnn.*) fail naming the reason.
cudnn_dir=$(python3 -c 'import os, nvidia.cudnn; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' \
  2>/dev/null || true)
if [[ -n "$cudnn_dir" && -e "$cudnn_dir/libcudnn.so.9" ]]; then
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cudnn_dir"
else
  cudnn_dir="(no nvidia.cudnn wheel; the loader's default paths)"
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 ||
    echo "nvidia-smi: unavailable"
  nvcc --version | tail -1
  echo "cuDNN for the fused attention: $cudnn_dir"
} | tee "$OUT/machine.txt"

if [[ -z "$PREBUILT" ]]; then
  start=$(date +%s)
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOECORE_BUILD_TESTS=ON -DMOECORE_CUDA=ON \
    >"$OUT/configure.log" 2>&1
  cmake --build "$BUILD" -j"$(nproc)" --target moecore moecore_cuda_tests moecore_tests >"$OUT/build.log" 2>&1
  echo "build: $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
fi

# The GPU tests: every one must run (a skip means no usable GPU) and pass.
status=0
# GPU_TEST_FILTER narrows the GPU tests (a rerun after a fix); the default runs them all.
timeout 300 "$BUILD/moecore_cuda_tests" --gtest_filter="${GPU_TEST_FILTER:-*}" --gtest_output="json:$OUT/gpu_tests.json" \
  2>&1 | tee "$OUT/gpu_tests.log" || status=1
# The column reductions' micro-benchmark (tests/cuda/test_cuda_reductions.cpp) prints its figures into the log.
grep -E "^reduction " "$OUT/gpu_tests.log" >"$OUT/reductions.txt" || true
if grep -q "\[  SKIPPED \]" "$OUT/gpu_tests.log"; then
  echo "gpu-test: GPU tests were skipped: no usable GPU" | tee -a "$OUT/gpu_tests.log"
  status=1
fi
# The host-side CUDA tests (allocator bookkeeping, --device) under the CUDA build.
if [[ -x "$BUILD/moecore_tests" ]]; then
  host_filter='CachingAllocator.*:DeviceSelect.*:GpuPlacement.*:NcclWatchdog.*:DeviceTensor.*:PhaseTimeline.*:SyncLedger.*:TimerObserver.*:GpuProfile.*'
  host_filter+=':AttentionBackend.*:CudnnAttention*'
  "$BUILD/moecore_tests" --gtest_filter="$host_filter" >"$OUT/host_tests.log" 2>&1 || status=1
fi
# Layout invariance on the GPU: every rank on GPU 0 (shared, so host-staged MPI between them).
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
if [[ -x "$BUILD/moecore_mpi_tests" ]]; then
  for np in 2 4; do
    CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=2 timeout 300 mpirun --oversubscribe --allow-run-as-root -np $np \
      "$BUILD/moecore_mpi_tests" --gtest_filter='*GpuLayouts*:*GpuCpLayouts*:GpuDispatch.*:OverlapGpu.*' \
      >"$OUT/gpu_layouts_$np.log" 2>&1 || status=1
  done
  # One GPU per rank (two or more GPUs here): NCCL for every group. Every ProcessGroup operation over NCCL against
  # host-staged MPI, the same layouts against one GPU rank, and a stalled rank ending an NCCL job by the watchdog.
  if [[ ${NGPU:-0} -ge 2 ]]; then
    for np in 2 4 8; do
      [[ $np -le $NGPU ]] || continue
      OMP_NUM_THREADS=2 timeout 300 mpirun --oversubscribe --allow-run-as-root -np $np "$BUILD/moecore_mpi_tests" \
        --gtest_filter='GpuNccl.*:*GpuLayouts*:*GpuCpLayouts*:GpuDispatch.*' >"$OUT/gpu_layouts_nccl_$np.log" 2>&1 ||
        status=1
      if grep -q "GpuNccl.*SKIPPED\|SKIPPED.*GpuNccl" "$OUT/gpu_layouts_nccl_$np.log"; then
        echo "gpu-test: GpuNccl was skipped on $np ranks and $NGPU GPUs" | tee -a "$OUT/gpu_layouts_nccl_$np.log"
        status=1
      fi
    done
    timeout 200 bash "$ROOT/tests/cuda/nccl_timeout.sh" "$BUILD/moecore" mpirun --oversubscribe --allow-run-as-root \
      >"$OUT/nccl_timeout.log" 2>&1 || status=1
  else
    echo "gpu-test: ${NGPU:-0} GPU(s): the NCCL layouts (one GPU per rank) need two or more" |
      tee "$OUT/gpu_layouts_nccl.log"
  fi
fi
# Generation on the GPU against the CPU; with GPU_LAUNCH_LINES=1 also Megatron's launch lines trained on the GPU
# against the CPU (tests/train/megatron_configs.py --on-gpu: its CPU runs take minutes, more than a short device
# session has).
timeout 300 bash "$ROOT/tests/ckpt/generate_cuda.sh" "$BUILD/moecore" >"$OUT/generate_cuda.log" 2>&1 || status=1
if [[ -n "${GPU_LAUNCH_LINES:-}" ]]; then
  timeout 1500 python3 "$ROOT/tests/train/megatron_configs.py" "$BUILD/moecore" --on-gpu >"$OUT/launch_lines_gpu.log" 2>&1 ||
    status=1
fi

# Benchmarks (figures for docs/performance.md and docs/cuda.md).
M="$BUILD/moecore"
# GPU_BENCHES="name ..." runs only those benchmarks (a rerun); the default runs them all.
run_bench() {
  local name=$1
  shift
  if [[ -n "${GPU_BENCHES:-}" && " $GPU_BENCHES " != *" $name "* ]]; then return 0; fi
  echo "\$ moecore $*" >"$OUT/bench_$name.txt"
  timeout 300 "$M" "$@" >>"$OUT/bench_$name.txt" 2>&1 || { echo "bench $name failed" >>"$OUT/bench_$name.txt"; status=1; }
}
run_bench gemm bench gemm --device cuda --size 8192 --iters 10
# Each collective's bus bandwidth over NCCL (one GPU per rank, every GPU here; one rank on a one-GPU machine, where
# it shows NCCL's one-rank copies), then a training step's traffic against its analytic minimum.
if [[ -z "${GPU_BENCHES:-}" || " $GPU_BENCHES " == *" comm "* ]]; then
  np=$(( ${NGPU:-1} >= 4 ? 4 : ${NGPU:-1} >= 2 ? 2 : 1 ))  # the default model's batch divides over 1, 2 or 4 ranks
  [[ $np -ge 1 ]] || np=1
  echo "\$ mpirun -np $np moecore bench comm --device cuda --iters 3" >"$OUT/bench_comm.txt"
  OMP_NUM_THREADS=2 timeout 300 mpirun --oversubscribe --allow-run-as-root -np $np "$M" bench comm --device cuda \
    --iters 3 >>"$OUT/bench_comm.txt" 2>&1 || { echo "bench comm failed" >>"$OUT/bench_comm.txt"; status=1; }
fi
run_bench attention_bf16 bench attention --device cuda --dtype bf16 --seq-length 4096 --num-attention-heads 16 \
  --num-query-groups 16 --kv-channels 128 --iters 5
# The Qwen3-MoE benchmark's attention: one sequence, 32 query heads over 4 kv heads (the dK/dV kernel splits the
# groups' heads, launch_attention_tc.h). The bf16 benches time cuDNN's fused attention against the native kernels run
# by run (their `attention_backends` line; --attention-backend native times the native kernels alone).
run_bench attention_gqa bench attention --device cuda --dtype bf16 --seq-length 4096 --micro-batch-size 1 \
  --num-attention-heads 32 --num-query-groups 4 --kv-channels 128 --iters 5
# MLA's head width (192; cuDNN's fused attention up to 256) and D 64.
run_bench attention_d192 bench attention --device cuda --dtype bf16 --seq-length 4096 --num-attention-heads 16 \
  --num-query-groups 16 --kv-channels 192 --iters 5
run_bench attention_d64 bench attention --device cuda --dtype bf16 --seq-length 4096 --num-attention-heads 16 \
  --num-query-groups 16 --kv-channels 64 --iters 5
# Which path each bf16 bench ran (cuDNN's route lines) and cuDNN against the native kernels, one line per shape.
grep -h -E "^moecore: attention|^attention_backends " "$OUT"/bench_attention_*.txt >"$OUT/attention_backends.txt" || true
run_bench attention_f32 bench attention --device cuda --seq-length 4096 --num-attention-heads 16 \
  --num-query-groups 16 --kv-channels 128 --iters 2
# The MoE layer at the Qwen3-30B-A3B and Mixtral shapes (torch_baselines.py measures PyTorch on the same shapes),
# then again with each grouped GEMM implementation (one grouped launch per GEMM, the per-expert loop).
run_bench moe_qwen3 bench moe-layer --device cuda --dtype bf16 --tokens 16384 --hidden 2048 --ffn 768 --experts 128 \
  --topk 8 --iters 5 --compare-grouped-gemm
run_bench moe_mixtral bench moe-layer --device cuda --dtype bf16 --tokens 16384 --hidden 4096 --ffn 14336 \
  --experts 8 --topk 2 --iters 3 --compare-grouped-gemm
run_bench grouped_gemm bench grouped-gemm --device cuda
# Training steps (dropout off: not on the GPU yet): a ~0.9B dense GPT, and the Qwen3-MoE-shaped model of
# torch_baselines.py's HF step.
NODROP="--hidden-dropout 0 --attention-dropout 0"
run_bench train_dense bench train --device cuda --iters 3 $NODROP --num-experts 0 --num-layers 16 --hidden-size 2048 \
  --ffn-hidden-size 5632 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 --global-batch-size 8
run_bench train_qwen3moe bench train --device cuda --iters 3 $NODROP --num-layers 8 --hidden-size 2048 \
  --num-attention-heads 32 --num-query-groups 4 --kv-channels 128 --qk-layernorm --num-experts 64 \
  --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-aux-loss-coeff 1e-3 --untie-embeddings-and-output-weights \
  --vocab-size 32768 --seq-length 4096 --micro-batch-size 1 --global-batch-size 4 --rotary-base 1000000
# bench train --device cuda prints its host synchronisations' call sites as BINARY+0xOFFSET frames: name them where
# the binary still has its symbols (a --prebuilt pack is stripped: run scripts/symbolize-sync-sites.sh on the build
# machine instead).
if [[ -z "$PREBUILT" ]] && command -v addr2line >/dev/null; then
  for b in train_dense train_qwen3moe; do
    if [[ -f "$OUT/bench_$b.txt" ]]; then
      "$ROOT/scripts/symbolize-sync-sites.sh" "$OUT/bench_$b.txt" "$M" >"$OUT/sync_sites_$b.txt" 2>&1 || true
    fi
  done
fi

# PyTorch on the same GPU in the same run: cuBLAS bf16 peak, SDPA, the MoE layer, the HF Qwen3-MoE step.
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 timeout 600 python3 "$ROOT/scripts/torch_baselines.py" ${TORCH_PARTS:-} >"$OUT/torch_baselines.txt" 2>&1 ||
    echo "torch baselines failed" >>"$OUT/torch_baselines.txt"
fi
# The host's CPU benchmarks on two cores (issue 25's machine is a 2-core Xeon with AMX; GPU machines have AMX Xeons):
# attention f32 and bf16, the MoE layer and the training step in bf16 (AMX's figures).
if [[ -n "${CPU_BENCH:-}" ]]; then
  C2="env OMP_NUM_THREADS=2 taskset -c 0,1 timeout 150 $M"
  {
    # The native-bf16 attention's AMX tiles against their emulation (skips without AMX: then the figures below are
    # AVX512-BF16's).
    if [[ -x "$BUILD/moecore_tests" ]]; then
      env OMP_NUM_THREADS=2 timeout 300 "$BUILD/moecore_tests" --gtest_filter='FlashNativeBf16.*' || status=1
    fi
    for dt in f32 bf16; do
      $C2 bench attention --device cpu --dtype $dt --seq-length 2048 --num-attention-heads 8 --num-query-groups 2 \
        --kv-channels 64 --iters 3
    done
    # Each bf16 kernel at the default shape and at bench train's (S 256, B 4, heads 16/4).
    for k in native onednn; do
      $C2 bench attention --device cpu --dtype bf16 --bf16-kernel $k --iters 3
      $C2 bench attention --device cpu --dtype bf16 --bf16-kernel $k --seq-length 256 --micro-batch-size 4 \
        --num-attention-heads 16 --num-query-groups 4 --iters 3
    done
    # The layer's split (GEMM rate against the peak, router, permutation, the rest) and the step's GEMMs by shape.
    $C2 bench moe-layer --device cpu --dtype bf16 --iters 3
    $C2 bench train --device cpu --dtype bf16 --iters 3
  } >"$OUT/cpu_amx.txt" 2>&1
fi

echo "gpu-test: logs and figures in $OUT (status $status)"
exit $status
