// Philox4x32-10 (see rng.h). Constants from the Random123 paper; checked against its known-answer vectors.
#include "moecore/core/rng.h"

#include <cmath>

namespace moecore {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

Philox4 philox4x32_10(Philox4 c, std::array<uint32_t, 2> k) {
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

Philox4 Philox::block(uint64_t index) const {
  Philox4 ctr = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream_),
                 static_cast<uint32_t>(stream_ >> 32)};
  return philox4x32_10(ctr, {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
}

namespace {
// 53-bit uniform in (0, 1) from two words.
inline double to_unit(uint32_t a, uint32_t b) {
  uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ (static_cast<uint64_t>(b) >> 11);  // 53 bits
  bits &= (1ull << 53) - 1;
  return (static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0);
}
}  // namespace

double Philox::uniform(uint64_t index) const {
  Philox4 r = block(index);
  return to_unit(r[0], r[1]);
}

double Philox::normal(uint64_t index) const {
  Philox4 r = block(index);
  double u1 = to_unit(r[0], r[1]);
  double u2 = to_unit(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace moecore
