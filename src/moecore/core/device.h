// Where a tensor's storage lives: host memory or one CUDA GPU. Four bytes, held by value in every Tensor; the CPU
// paths test it once per kernel call (never per element), so they cost nothing more than before.
#pragma once

#include <cstdint>
#include <string>

namespace moecore {

struct Device {
  enum Kind : int8_t { kCpu = 0, kCuda = 1 };
  Kind kind = kCpu;
  int16_t index = 0;  // GPU ordinal; 0 for the CPU

  static constexpr Device cpu() { return Device{}; }
  static constexpr Device cuda(int i = 0) { return Device{kCuda, static_cast<int16_t>(i)}; }
  constexpr bool is_cpu() const { return kind == kCpu; }
  constexpr bool is_cuda() const { return kind == kCuda; }
  constexpr bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace moecore
