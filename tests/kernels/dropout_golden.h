// Golden dropout masks, held by both backends: tests/kernels/test_dropout.cpp checks that the CPU kernels draw them and
// tests/cuda_emulate (the CUDA kernels' own source run on the host) that the GPU kernels draw them, so the two devices
// drop the same elements. Each case is hashed (FNV-1a 64 over one byte per element, 1 kept, 0 dropped) in the order
// given at its struct; the values were taken from the CPU kernels. Only <cstdint>: the emulation harnesses include it.
#pragma once

#include <cstdint>

namespace moecore::testing::dropout_golden {

// Hidden dropout of a ones tensor [S, B, C] rows s·B + b, element (s, b, c) at (sample[b], seq_offset + s, c):
// order s, b, c.
struct HiddenCase {
  uint64_t seed, site;
  double p;
  int64_t S, B, C, seq_offset;
  int64_t sample[3];
  uint64_t hash;
  int64_t kept;
};
inline constexpr HiddenCase kHidden[] = {
    {1234, 0x1111, 0.1, 5, 2, 70, 0, {0, 1}, 0x9c5b8a90380d244dull, 636},
    {99, 0xABCDEF0123ull, 0.5, 3, 3, 129, 77, {5, (int64_t{7} << 32) | 3, 100000}, 0xffee610df2d1c923ull, 598},
    {7, 3, 0.9, 4, 1, 4, 4097, {42}, 0x663ae58c3148e82aull, 1},
    {5, 0x42, 0.3, 6, 2, 1, 2, {11, 12}, 0xd81edf399a701f00ull, 9},
};

// Attention dropout (AttentionDropout with these offsets; key_offset −1: seq_offset) over every (query i, key j) of
// [0, S)², causal or not: order b, h, i, j.
struct AttentionCase {
  uint64_t seed, site;
  double p;
  int64_t B, Nq, S, head_offset, seq_offset, key_offset;
  int64_t sample[2];
  uint64_t hash;
  int64_t kept;
};
inline constexpr AttentionCase kAttention[] = {
    {1234, 0x2222, 0.1, 2, 3, 70, 0, 0, -1, {3, 4}, 0xefb84104bbd8a98eull, 26449},
    {77, 0x5555, 0.25, 1, 2, 40, 5, 13, 130, {(int64_t{9} << 32) | 1}, 0xe31ee3a365204716ull, 2347},
    {3, 0x77, 0.5, 2, 2, 33, 0, 64, -1, {0, 1}, 0x7a9bc251a34a020aull, 2149},
};

constexpr uint64_t kFnvStart = 0xcbf29ce484222325ull;
inline uint64_t fnv_add(uint64_t h, bool kept) {
  return (h ^ static_cast<uint64_t>(kept)) * 0x100000001b3ull;
}

}  // namespace moecore::testing::dropout_golden
