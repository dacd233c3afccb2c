// The expert-parallel dispatcher tests' inputs: reproducible uniform values and a routing of top-K distinct experts
// per token with some assignments dropped (the layouts a capacity factor leaves).
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/moe/routed_tokens.h"

namespace moecore::testing {

// Values in [−1, 1) from an LCG seeded by `seed`, in dtype `dt`.
inline Tensor dispatch_values(const Shape& s, uint64_t seed, DType dt = DType::F32) {
  Tensor t = Tensor::empty(s, dt);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < t.numel(); i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.set_item(i, static_cast<double>(x >> 40) / static_cast<double>(1 << 24) * 2 - 1);
  }
  return t;
}

// Top-K distinct experts of E per token (a seeded shuffle), probabilities from dispatch_values in `probs_t`; every
// assignment with (t + j) % 7 == 3 dropped (−1, probability 0).
inline moe::RoutedTokens dropped_routing(int64_t T, int64_t K, int64_t E, uint64_t seed, DType probs_t = DType::F32) {
  moe::RoutedTokens r;
  r.idx_TK = Tensor::empty({T, K}, DType::I32);
  r.probs_TK = dispatch_values({T, K}, seed + 1, probs_t);
  uint64_t x = seed + 3;
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; i--) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(perm[static_cast<size_t>(i)], perm[(x >> 33) % static_cast<uint64_t>(i + 1)]);
    }
    for (int64_t j = 0; j < K; j++) {
      const bool drop = (t + j) % 7 == 3;
      r.idx_TK.data<int32_t>()[t * K + j] = drop ? -1 : perm[static_cast<size_t>(j)];
      if (drop) r.probs_TK.set_item(t * K + j, 0.0);
    }
  }
  return r;
}

}  // namespace moecore::testing
