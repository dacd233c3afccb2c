// The arithmetic behind every dropout mask (dropout.h), written once for both backends: the key of a (seed, site)
// pair and of a sub-mask, and the keep bits of one Philox4x32-10 block. The CPU kernels (kernels/cpu/dropout.cpp)
// derive their keys here and the CUDA kernels (kernels/cuda/dropout.cu, the attention kernels) run the same rounds on
// the device, so both draw the same mask from the same coordinates. Only <cstdint>: nvcc parses it too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOE_DROPOUT_HD __host__ __device__ __forceinline__
#else
#define MOE_DROPOUT_HD inline
#endif

namespace moecore::kernels::dropout_philox {

// The most sequences of one micro-batch the CUDA dropout kernels take: their sample indices ride in the launch
// arguments (kernels/cuda/launch_dropout.h), 1 KiB of the 4 KiB a launch may pass.
constexpr int kMaxGpuSamples = 128;

// SplitMix64's finalizer: a bijective 64-bit mix, so distinct (seed, site) pairs give well-spread keys.
MOE_DROPOUT_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The key of the mask of `site` in a run seeded with `seed` (DropoutMask::make).
MOE_DROPOUT_HD uint64_t site_key(uint64_t seed, uint64_t site) {
  return mix64(seed ^ mix64(site));
}

// The key of sub-mask `index` under `key` (DropoutMask::sub: one per attention head).
MOE_DROPOUT_HD uint64_t sub_key(uint64_t key, uint64_t index) {
  return mix64(key ^ mix64(index + 0x5851F42D4C957F2Dull));
}

// Philox4x32-10 of counter x under key (k0, k1), in place (core/rng.cpp's rounds).
MOE_DROPOUT_HD void philox4x32_10(uint32_t (&x)[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
#if defined(__CUDA_ARCH__)
    const uint32_t hi0 = __umulhi(0xD2511F53u, x[0]), lo0 = 0xD2511F53u * x[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, x[2]), lo1 = 0xCD9E8D57u * x[2];
#else
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * x[0], p1 = static_cast<uint64_t>(0xCD9E8D57u) * x[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
#endif
    const uint32_t y0 = hi1 ^ x[1] ^ k0, y2 = hi0 ^ x[3] ^ k1;
    x[0] = y0;
    x[1] = lo1;
    x[2] = y2;
    x[3] = lo0;
  }
}

// Bit w (w < 4) set where element (sample, row, 4·block + w) is kept: word w of the block at counter
// (block, row, sample low, sample high) is at or above the threshold.
MOE_DROPOUT_HD uint32_t keep_nibble(uint64_t key, uint32_t threshold, uint64_t sample, uint64_t row, uint64_t block) {
  uint32_t x[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(row), static_cast<uint32_t>(sample),
                   static_cast<uint32_t>(sample >> 32)};
  philox4x32_10(x, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
  return static_cast<uint32_t>(x[0] >= threshold) | static_cast<uint32_t>(x[1] >= threshold) << 1 |
         static_cast<uint32_t>(x[2] >= threshold) << 2 | static_cast<uint32_t>(x[3] >= threshold) << 3;
}

// Bit c (c < 16) set where element (sample, row, col0 + c) is kept: 4 blocks when col0 is a multiple of 4, else 5.
MOE_DROPOUT_HD uint32_t keep_bits16(uint64_t key, uint32_t threshold, uint64_t sample, uint64_t row, uint64_t col0) {
  const uint64_t first = col0 / 4;
  const unsigned shift = static_cast<unsigned>(col0 % 4);
  uint64_t bits = 0;  // nibbles of blocks first, first + 1, ...
  const int blocks = shift == 0 ? 4 : 5;
  for (int i = 0; i < blocks; i++)
    bits |= static_cast<uint64_t>(keep_nibble(key, threshold, sample, row, first + static_cast<uint64_t>(i)))
            << (4 * i);
  return static_cast<uint32_t>(bits >> shift) & 0xFFFFu;
}

}  // namespace moecore::kernels::dropout_philox
