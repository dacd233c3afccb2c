// Pointer-level launcher of the grouped expert GEMMs' pointer arrays (grouped_gemm_ptrs.cu): cuBLAS's grouped call
// reads each problem's A, B and C addresses from device memory. Like launch.h, nvcc parses nothing of moecore but
// this. Caller: kernels/cuda/grouped_gemm.cpp. The launch queues work on `s` and returns; nothing here synchronises
// with the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

// Problems per builder launch: the problem list travels in the kernel's arguments (by value, so no host-to-device
// copy is queued and a CUDA graph can capture the launch), within the 4 KiB a launch's arguments may take.
constexpr int kGroupedPtrsPerLaunch = 256;

// Operand o (0: A, 1: B, 2: C) of problem g is base[o] + row[g]·row_stride[o] + expert[g]·expert_stride[o] (bytes):
// a block of expert-major rows (row stride the row's bytes) or one expert's matrix (expert stride the matrix's bytes).
struct GroupedPtrArgs {
  const char* base[3];
  int64_t row_stride[3];
  int64_t expert_stride[3];
  int count;  // problems in this launch, at most kGroupedPtrsPerLaunch
  int32_t expert[kGroupedPtrsPerLaunch];
  int64_t row[kGroupedPtrsPerLaunch];
};

// out[o·G + first + g] = operand o of problem g, for g < args.count: the three arrays of a G-problem grouped call
// ([A pointers | B pointers | C pointers]), this launch's problems starting at `first`.
void grouped_gemm_pointers(const GroupedPtrArgs& args, void** out, int64_t G, int64_t first, cudaStream_t s);

}  // namespace moecore::launch
