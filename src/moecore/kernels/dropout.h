// Dropout with masks defined over global coordinates, never stored: element (sample n, row r, column c) of a site
// is kept when word c%4 of the Philox4x32-10 block at counter (c/4, r, n) under the site's key is at or above
// p·2³², and kept elements are scaled by 1/(1−p) (inverted dropout, as torch.nn.functional.dropout). Every rank
// and every layout draws the same mask for the same element; backward regenerates it instead of keeping a mask
// (no memory, one Philox block per 4 elements). The keys and the rounds are dropout_philox.h's, shared by the CPU and
// CUDA kernels, so a tensor on either device draws the same mask. Not the RNG or the masks of Megatron (PyTorch's
// CUDA Philox offsets), only the same distribution.
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

struct DropoutMask {
  double p = 0;            // drop probability in [0, 1)
  uint32_t key[2] = {};    // Philox key: (seed, site) mixed
  uint32_t threshold = 0;  // a word below it drops
  bool on() const { return p > 0; }
  uint64_t key64() const { return static_cast<uint64_t>(key[1]) << 32 | key[0]; }
  // The mask of `site` (a stream id: stream_id of the site's name) in a run seeded with `seed`.
  static DropoutMask make(uint64_t seed, uint64_t site, double p);
  // An independent mask under the same site, e.g. one per attention head.
  DropoutMask sub(uint64_t index) const;
};

// z[0..n) = the multipliers (0 or 1/(1−p)) of elements (sample, row, col0 .. col0+n).
template <typename T>
void dropout_multipliers(const DropoutMask& m, uint64_t sample, uint64_t row, uint64_t col0, int64_t n, T* z);
// The same mask as bits, for n ≤ 64 elements (sample, row0 + r, col0 .. col0+n) of each of `rows` rows: bit c of
// bits[r] set where z[c] keeps. Where col0 is a multiple of 4 and the CPU has AVX-512, the Philox words are compared
// in registers and never stored, two rows' rounds interleaved.
void dropout_keep_bits(const DropoutMask& m, uint64_t sample, uint64_t row0, int rows, uint64_t col0, int64_t n,
                       uint64_t* bits);

// x [S, B, C] (rows s·B + b of any rank-2+ shape with S·B rows; f32 or f64 on the CPU, f32 on a GPU): y = x ⊙ mask
// with the element at (s, b, c) taken at (sample_B[b], seq_offset + s, c). y may be x (in place). The backend of x
// (kernels/dispatch.cpp); the same bits on either.
void dropout_forward(const Tensor& x_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                     int64_t seq_offset, Tensor& y_SBC);
// dy -> dx = dy ⊙ mask (the same mask; written, may be dy).
void dropout_backward(const Tensor& dy_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                      int64_t seq_offset, Tensor& dx_SBC);

// dropout_forward's kernel as one backend implements it (kernels/cpu/dropout.cpp, kernels/cuda/dropout.cpp), for
// the shapes kernels/dispatch.cpp has checked and a mask that is on; dispatch.cpp picks the table of the input's
// device.
struct DropoutKernels {
  void (*forward)(const Tensor& x_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B, int64_t seq_offset,
                  Tensor& y_SBC);
};

}  // namespace moecore::kernels
