// Counter-based RNG: Philox4x32-10 (Salmon et al., SC'11). A value depends only on (seed, stream, index), so
// every rank draws the same number for the same global element whatever the sharding. Streams name a purpose
// (a parameter's name hashed, dropout of layer i, jitter, ...).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace moecore {

using Philox4 = std::array<uint32_t, 4>;

// One Philox4x32-10 block: 10 rounds of the counter under the key.
Philox4 philox4x32_10(Philox4 counter, std::array<uint32_t, 2> key);

// FNV-1a 64-bit: a stable stream id from a name (parameter names, purposes).
uint64_t stream_id(std::string_view name);

class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  // 4 random words for counter `index`.
  Philox4 block(uint64_t index) const;
  // Uniform in the open interval (0, 1) for element `index`.
  double uniform(uint64_t index) const;
  // Standard normal for element `index` (Box-Muller on one block).
  double normal(uint64_t index) const;

 private:
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace moecore
