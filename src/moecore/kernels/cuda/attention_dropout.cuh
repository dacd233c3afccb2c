// Attention dropout's keep bits on the device, for the attention kernels (attention.cu, attention_tc_*.cuh): the
// mask of kernels/attention.h's AttentionDropout, probability (b, h, i, j) kept by Philox block
// ((col_offset + j) / 4, row_offset + i, sample[b]) under sub_key(key, head_offset + h) (dropout_philox.h, the CPU
// kernels' own arithmetic), so both devices drop the same probabilities. Kept probabilities are multiplied by keep.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moecore/kernels/cuda/launch_dropout.h"
#include "moecore/kernels/dropout_philox.h"

namespace moecore::launch {

// The mask of query head h of sequence b.
struct HeadMask {
  uint64_t key = 0;
  uint64_t sample = 0;
  uint32_t threshold = 0;
  HeadMask() = default;
  __device__ __forceinline__ HeadMask(const DropoutParams& p, int64_t b, int64_t h)
      : key(kernels::dropout_philox::sub_key(p.key, static_cast<uint64_t>(p.head_offset + h))),
        sample(static_cast<uint64_t>(p.sample[b])),
        threshold(p.threshold) {}
  // Whether global position pair (query row, key col) is kept: one Philox block.
  __device__ __forceinline__ bool kept(uint64_t row, uint64_t col) const {
    return (kernels::dropout_philox::keep_nibble(key, threshold, sample, row, col / 4) >> (col % 4)) & 1u;
  }
  // Bit c of the result set where key col0 + c of query row is kept, c < 16.
  __device__ __forceinline__ uint32_t bits16(uint64_t row, uint64_t col0) const {
    return kernels::dropout_philox::keep_bits16(key, threshold, sample, row, col0);
  }
};

// One query row's walk over consecutive keys: a Philox block per 4 keys, each computed once.
struct RowMask {
  HeadMask m;
  uint64_t row, col0;
  uint64_t block = ~uint64_t{0};
  uint32_t nibble = 0;
  // Whether local key j of the row is kept.
  __device__ __forceinline__ bool kept(int64_t j) {
    const uint64_t col = col0 + static_cast<uint64_t>(j);
    if (col / 4 != block) {
      block = col / 4;
      nibble = kernels::dropout_philox::keep_nibble(m.key, m.threshold, m.sample, row, block);
    }
    return (nibble >> (col % 4)) & 1u;
  }
};

// The keep bits of a tile of R query rows (local rows i0 .. i0 + R − 1) × 64 keys (local keys j0 .. j0 + 63) into
// bits_s[R] in shared memory, bit c of bits_s[r] for key j0 + c of row i0 + r: 16 keys per item, R·4 items over
// `threads` threads (5 Philox blocks an item when the keys' global positions are not a multiple of 4, else 4).
template <int R, int kThreadsPerBlock>
__device__ __forceinline__ void tile_keep_bits(uint64_t* bits_s, const DropoutParams& p, const HeadMask& m, int64_t i0,
                                               int64_t j0) {
  auto* part = reinterpret_cast<uint16_t*>(bits_s);  // bits_s[r] = part[4r] | part[4r+1] << 16 | ... (little-endian)
  for (int it = threadIdx.x; it < R * 4; it += kThreadsPerBlock) {
    const int r = it / 4, seg = it % 4;
    part[it] = static_cast<uint16_t>(
        m.bits16(static_cast<uint64_t>(p.row_offset + i0 + r), static_cast<uint64_t>(p.col_offset + j0 + 16 * seg)));
  }
}

}  // namespace moecore::launch
