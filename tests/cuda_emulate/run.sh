#!/usr/bin/env bash
# The CUDA kernels run on the host, for CI machines without a GPU (CTest cuda_*_host_emulation): each harness
# compiles the kernels' own .cu source against an emulation of the CUDA primitives, with ASan, and checks the results
# against host references. Usage: run.sh kernels|optim_router|grouped|attention_tc WORK_DIR. Needs g++ and the CUDA
# toolkit's headers (/usr/local/cuda/include, or $CUDA_HOME/include): without them it says so and exits 77, which
# CTest reports as skipped (SKIP_RETURN_CODE).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
which=$1
work=$2
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
if [ ! -f "$cuda_inc/cuda_runtime.h" ]; then
  echo "cuda emulation: skipped, no CUDA headers in $cuda_inc"
  exit 77
fi
mkdir -p "$work"
flags=(-std=c++20 -O1 -g -fsanitize=address -Wno-attributes -w -I"$root/src" -I"$root/tests" -I"$cuda_inc" -I"$work")
case "$which" in
  kernels)
    python3 "$here/cuda_kernels_emulate.py" "$work/cuda_kernels_emulate.inc" \
      "$root"/src/moecore/kernels/cuda/{col_reduce,norm_bias,elementwise,embedding_bwd,dropout,attention,attention_merge}.cu
    g++ "${flags[@]}" "$here/cuda_kernels_emulate.cpp" -o "$work/cuda_kernels_emulate"
    "$work/cuda_kernels_emulate"
    ;;
  optim_router)
    python3 "$here/cuda_kernels_emulate.py" "$work/optim_router_emulate.inc" \
      "$root"/src/moecore/kernels/cuda/{col_reduce,elementwise,routing,moe_permute,multi_tensor}.cu
    g++ "${flags[@]}" "$here/optim_router_emulate.cpp" -o "$work/optim_router_emulate"
    "$work/optim_router_emulate"
    ;;
  grouped)
    python3 "$here/cuda_kernels_emulate.py" "$work/grouped_emulate.inc" \
      "$root"/src/moecore/kernels/cuda/{col_reduce,norm_bias,elementwise,moe_permute}.cu
    g++ "${flags[@]}" "$here/grouped_emulate.cpp" -o "$work/grouped_emulate"
    "$work/grouped_emulate"
    ;;
  attention_tc)
    g++ "${flags[@]}" "$here/attention_tc_emulate.cpp" -o "$work/attention_tc_emulate"
    "$work/attention_tc_emulate"
    ;;
  *)
    echo "usage: run.sh kernels|optim_router|grouped|attention_tc WORK_DIR" >&2
    exit 2
    ;;
esac
