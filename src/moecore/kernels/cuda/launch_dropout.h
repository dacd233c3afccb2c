// Pointer-level form of a dropout mask for the CUDA kernels (dropout.cu, and the attention kernels, which drop
// probabilities inside): what kernels/dropout.h's DropoutMask and AttentionDropout say, as one by-value kernel
// argument, with the micro-batch's global sample indices carried in it (no device copy, no host synchronisation).
// The mask bits are dropout_philox.h's, the CPU kernels' own arithmetic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moecore/kernels/dropout_philox.h"

namespace moecore::launch {

constexpr int kDropoutMaxSamples = kernels::dropout_philox::kMaxGpuSamples;

struct DropoutParams {
  int on = 0;               // 0: no dropout (the kernels' plain variants run)
  uint32_t threshold = 0;   // a Philox word below it drops
  float keep = 1;           // the kept elements' multiplier 1/(1−p), in f32 as the CPU kernels round it
  uint64_t key = 0;         // the mask's Philox key; attention: per query head, sub_key(key, head_offset + h)
  int64_t head_offset = 0;  // attention: the global index of query head 0
  int64_t row_offset = 0;   // global position of row (query) 0
  int64_t col_offset = 0;   // attention: global position of key 0 (hidden dropout: columns start at 0)
  int64_t samples = 0;      // B
  int64_t sample[kDropoutMaxSamples] = {};  // the global sample index of each sequence
};

// Hidden dropout: x, y [rows = S·B, C] f32 (y may be x): y = x ⊙ z, element (s, b, c) at (sample[b], row_offset + s,
// c), z ∈ {0, keep}. p.on must be set.
void dropout_apply(const float* x, float* y, int64_t rows, int64_t C, const DropoutParams& p, cudaStream_t s);

}  // namespace moecore::launch
