#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: configure and build with the CUDA backend on, run the GPU tests (CTest label gpu)
# and the GPU benchmarks, and write every log and figure into OUTDIR. Exits non-zero when a GPU test fails or
# is skipped (a skip here means the GPU was not usable).
# Usage: scripts/gpu-test.sh OUTDIR [BUILD_DIR | --prebuilt PACK_DIR]
# --prebuilt runs the binaries of a pack made by scripts/gpu-pack.sh (for GPU machines without Debian's packages).
# GPU_TEST_BUDGET_S=N ends the run within about N seconds (a short lease): each stage's time limit is cut to what is
# left, a stage with under 20 s left is skipped and named in OUTDIR/summary.txt, and the run then fails.
set -euo pipefail
DEADLINE=$(( $(date +%s) + ${GPU_TEST_BUDGET_S:-1000000} ))

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
# limit N: the smaller of N seconds and the time left before the deadline (10 s kept for the summary); 0 when under
# 20 s are left, and the caller skips its stage (named in skipped.txt).
limit() {
  local left=$(( DEADLINE - $(date +%s) - 10 ))
  if (( left < 20 )); then echo 0; elif (( left < $1 )); then echo "$left"; else echo "$1"; fi
}
skip() { echo "$1: skipped, the budget (GPU_TEST_BUDGET_S) was spent" | tee -a "$OUT/skipped.txt"; status=1; }
status=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export GTEST_COLOR=no  # the logs are read by the summary below
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
  if [[ -n "$PREBUILT" && -f "$PREBUILT/commit.txt" ]]; then
    echo "commit: $(cat "$PREBUILT/commit.txt") (the pack's)"
  else
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  fi
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
# GPU_TEST_FILTER narrows the GPU tests (a rerun after a fix); the default runs them all. Each test suite runs in a
# process of its own, GPU_TEST_JOBS (4) at a time on the one GPU: a sticky CUDA error (an illegal address poisons the
# context) or a hang then costs one suite, not every test after it. gpu_tests.log is their logs in suite order.
mkdir -p "$OUT/gpu_suites"
"$BUILD/moecore_cuda_tests" --gtest_list_tests --gtest_filter="${GPU_TEST_FILTER:-*}" |
  awk '/^[^ ]/{suite=$1; next} /^  [^ ]/{print suite $1}' |
  awk -F. '{f[$1] = f[$1] (f[$1] ? ":" : "") $0} END{for (s in f) print s, f[s]}' | sort >"$OUT/gpu_suites/list"
t=$(limit 300)
# shellcheck disable=SC2016
xargs -a "$OUT/gpu_suites/list" -P "${GPU_TEST_JOBS:-4}" -L 1 bash -c '
  dir=$1 deadline=$2 bin=$3 suite=$4 filter=$5; log="$dir/${suite//\//_}.log" left=$(( deadline - $(date +%s) ))
  if (( left < 5 )); then echo "[  SKIPPED ] $suite: the budget was spent" >"$log"; exit 0; fi
  timeout -k 5 "$left" "$bin" --gtest_filter="$filter" >"$log" 2>&1 ||
    echo "[  FAILED  ] suite $suite (exit $?): $(tail -1 "$log")" >>"$log"' \
  _ "$OUT/gpu_suites" $(( $(date +%s) + t )) "$BUILD/moecore_cuda_tests" || status=1
while read -r suite _; do cat "$OUT/gpu_suites/${suite//\//_}.log" || true; done <"$OUT/gpu_suites/list" \
  >"$OUT/gpu_tests.log"
grep -q "^\[  FAILED  \]" "$OUT/gpu_tests.log" && status=1
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
  t=$(limit 120)
  [[ $t -gt 0 ]] || skip host_tests
  [[ $t -eq 0 ]] || timeout "$t" "$BUILD/moecore_tests" --gtest_filter="$host_filter" >"$OUT/host_tests.log" 2>&1 ||
    status=1
fi
# Layout invariance on the GPU: every rank on GPU 0 (shared, so host-staged MPI between them).
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
if [[ -x "$BUILD/moecore_mpi_tests" ]]; then
  for np in 2 4; do
    t=$(limit 300)
    [[ $t -gt 0 ]] || { skip "gpu_layouts_$np"; continue; }
    CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=2 timeout "$t" mpirun --oversubscribe --allow-run-as-root -np $np \
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
# Generation on the GPU against the CPU.
t=$(limit 300)
[[ $t -gt 0 ]] || skip generate_cuda
[[ $t -eq 0 ]] || timeout "$t" bash "$ROOT/tests/ckpt/generate_cuda.sh" "$BUILD/moecore" >"$OUT/generate_cuda.log" 2>&1 || status=1

# Benchmarks (figures for docs/performance.md and docs/cuda.md).
M="$BUILD/moecore"
# GPU_BENCHES="name ..." runs only those benchmarks (a rerun); the default runs them all.
run_bench() {
  local name=$1
  shift
  if [[ -n "${GPU_BENCHES:-}" && " $GPU_BENCHES " != *" $name "* ]]; then return 0; fi
  local t
  t=$(limit "${BENCH_LIMIT_S:-300}")
  [[ $t -gt 0 ]] || { skip "bench $name"; return 0; }
  echo "\$ moecore $*" >"$OUT/bench_$name.txt"
  timeout "$t" "$M" "$@" >>"$OUT/bench_$name.txt" 2>&1 || { echo "bench $name failed" >>"$OUT/bench_$name.txt"; status=1; }
}
run_bench gemm bench gemm --device cuda --size 8192 --iters 10
# Each collective's bus bandwidth over NCCL (one GPU per rank, every GPU here; one rank on a one-GPU machine, where
# it shows NCCL's one-rank copies), then a training step's traffic against its analytic minimum.
if [[ $(limit 300) -eq 0 ]]; then
  skip "bench comm"
elif [[ -z "${GPU_BENCHES:-}" || " $GPU_BENCHES " == *" comm "* ]]; then
  np=$(( ${NGPU:-1} >= 4 ? 4 : ${NGPU:-1} >= 2 ? 2 : 1 ))  # the default model's batch divides over 1, 2 or 4 ranks
  [[ $np -ge 1 ]] || np=1
  echo "\$ mpirun -np $np moecore bench comm --device cuda --iters 3" >"$OUT/bench_comm.txt"
  OMP_NUM_THREADS=2 timeout "$(limit 300)" mpirun --oversubscribe --allow-run-as-root -np $np "$M" bench comm --device cuda \
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
# The MoE layer at the Qwen3-30B-A3B and Mixtral shapes (torch_baselines.py measures PyTorch on the same shapes).
run_bench moe_qwen3 bench moe-layer --device cuda --dtype bf16 --tokens 16384 --hidden 2048 --ffn 768 --experts 128 \
  --topk 8 --iters 5
run_bench moe_mixtral bench moe-layer --device cuda --dtype bf16 --tokens 16384 --hidden 4096 --ffn 14336 \
  --experts 8 --topk 2 --iters 3
run_bench grouped_gemm bench grouped-gemm --device cuda
# Qwen3-30B-A3B's expert GEMMs at 4,096 rows per expert, the shape of Megatron-Bridge's 16-GPU card run (EP 16):
# cuBLAS measured against the step-time model's GEMM rate at that shape (docs/plan.md, "Rates").
run_bench grouped_gemm_4096_rows bench grouped-gemm --device cuda --model qwen3-30b-a3b --tokens 65536 --iters 5
# Training steps (dropout off: not on the GPU yet): a ~0.9B dense GPT, and the Qwen3-MoE-shaped model of
# torch_baselines.py's HF step.
NODROP="--hidden-dropout 0 --attention-dropout 0"
run_bench train_dense bench train --device cuda --iters 3 $NODROP --num-experts 0 --num-layers 16 --hidden-size 2048 \
  --ffn-hidden-size 5632 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 --global-batch-size 8
run_bench train_qwen3moe bench train --device cuda --iters 3 $NODROP --num-layers 8 --hidden-size 2048 \
  --num-attention-heads 32 --num-query-groups 4 --kv-channels 128 --qk-layernorm --num-experts 64 \
  --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-aux-loss-coeff 1e-3 --untie-embeddings-and-output-weights \
  --vocab-size 32768 --seq-length 4096 --micro-batch-size 1 --global-batch-size 4 --rotary-base 1000000
# The same step's memory plan beside the allocator's peak with selective recompute, and with activation offloading.
QWEN3MOE="--num-layers 8 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4 --kv-channels 128
  --qk-layernorm --num-experts 64 --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-aux-loss-coeff 1e-3
  --untie-embeddings-and-output-weights --vocab-size 32768 --seq-length 4096 --micro-batch-size 1
  --global-batch-size 4 --rotary-base 1000000"
# shellcheck disable=SC2086
run_bench train_qwen3moe_recompute bench train --device cuda --iters 2 $NODROP $QWEN3MOE --recompute-granularity \
  selective --recompute-modules core_attn moe_act layernorm
# shellcheck disable=SC2086
run_bench train_qwen3moe_offload bench train --device cuda --iters 2 $NODROP $QWEN3MOE \
  --fine-grained-activation-offloading --offload-modules attn_norm core_attn attn_proj mlp_norm expert_fc1 moe_act
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
  t=$(limit 600)
  [[ $t -gt 0 ]] || skip torch_baselines
  [[ $t -eq 0 ]] || env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 timeout "$t" python3 "$ROOT/scripts/torch_baselines.py" ${TORCH_PARTS:-} >"$OUT/torch_baselines.txt" 2>&1 ||
    echo "torch baselines failed" >>"$OUT/torch_baselines.txt"
fi
# With GPU_LAUNCH_LINES=1, Megatron's launch lines trained on the GPU against the CPU (tests/train/megatron_configs.py
# --on-gpu; last, as its CPU runs take minutes of a short lease).
if [[ -n "${GPU_LAUNCH_LINES:-}" ]]; then
  t=$(limit 1500)
  [[ $t -gt 0 ]] || skip launch_lines_gpu
  [[ $t -eq 0 ]] || timeout "$t" python3 "$ROOT/tests/train/megatron_configs.py" "$BUILD/moecore" --on-gpu \
    >"$OUT/launch_lines_gpu.log" 2>&1 || status=1
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

# One summary: each gtest log's totals and failures, each script's verdict, what was skipped.
{
  if [[ -f "$OUT/gpu_tests.log" ]]; then
    echo "== gpu_tests.log: $(grep -c "^\[       OK \]" "$OUT/gpu_tests.log") passed in" \
      "$(wc -l <"$OUT/gpu_suites/list") suites, $(grep -c "^\[  SKIPPED \] [A-Za-z].* ms)$" "$OUT/gpu_tests.log") skipped"
    grep -E "^\[  (FAILED|SKIPPED) +\] [A-Za-z]" "$OUT/gpu_tests.log" | sed 's/ ([0-9]* ms)$//' | sort -u || true
  fi
  for f in "$OUT"/host_tests.log "$OUT"/gpu_layouts_[0-9].log; do
    [[ -f "$f" ]] || continue
    echo "== $(basename "$f"): $(grep -E "^\[==========\] [0-9]+ tests? .* ran" "$f" | tail -1)"
    grep -E "^\[  (PASSED|SKIPPED) +\] [0-9]+ test|^\[  FAILED  \] [A-Za-z]" "$f" | sed 's/ ([0-9]* ms)$//' |
      sort | uniq -c || true
    grep -q "^\[==========\] .* ran" "$f" || echo "   (did not finish: $(tail -1 "$f"))"
  done
  [[ -f "$OUT/generate_cuda.log" ]] && echo "== generate_cuda: $(tail -1 "$OUT/generate_cuda.log")"
  [[ -f "$OUT/launch_lines_gpu.log" ]] && { grep -E "^(ok|FAIL) " "$OUT/launch_lines_gpu.log" | sed 's/^/== launch line: /' || true; }
  grep -l "failed" "$OUT"/bench_*.txt 2>/dev/null | sed 's/^/== failed bench: /' || true
  [[ ! -f "$OUT/skipped.txt" ]] || sed 's/^/== /' "$OUT/skipped.txt"
  echo "status $status, $(( $(date +%s) - DEADLINE + ${GPU_TEST_BUDGET_S:-1000000} )) s"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
echo "gpu-test: logs and figures in $OUT (status $status)"
exit $status
