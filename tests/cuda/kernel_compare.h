// Helpers of the GPU-vs-CPU kernel tests: random host tensors, copies to the GPU, and the largest difference
// relative to the reference's largest magnitude.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "moecore/core/tensor.h"
#include "moecore/kernels/attention_backend.h"

namespace moecore::testing_cuda {

inline Tensor host_random(const Shape& s, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::F32);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); i++) {  // splitmix64 → uniform(-scale, scale)
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    t.set_item(i, scale * (static_cast<double>(z >> 11) / 0x1p53 * 2 - 1));
  }
  return t;
}

// With MOECORE_GPU_TEST_TRACE set: one flushed line on stderr per stage of a long test, so that a run stopped by a
// timeout shows where it was (a kernel that never returns, or a CPU reference that does not).
inline void trace(const std::string& what) {
  static const bool on = std::getenv("MOECORE_GPU_TEST_TRACE") != nullptr;
  if (!on) return;
  std::fprintf(stderr, "trace: %s\n", what.c_str());
  std::fflush(stderr);
}

// Runs a scope's GPU bf16 attention on the backend named (cuDNN's fused attention or the native kernels), restoring
// the previous choice after.
struct ScopedAttentionBackend {
  explicit ScopedAttentionBackend(kernels::AttentionBackend b) : prev(kernels::attention_backend()) {
    kernels::set_attention_backend(b);
  }
  ~ScopedAttentionBackend() { kernels::set_attention_backend(prev); }
  ScopedAttentionBackend(const ScopedAttentionBackend&) = delete;
  ScopedAttentionBackend& operator=(const ScopedAttentionBackend&) = delete;
  kernels::AttentionBackend prev;
};

inline Tensor gpu(const Tensor& t) {
  return t.to(Device::cuda());
}

// max |got − want| / max(max |scale|, tiny), scale = want unless given (a reference that is 0 in exact arithmetic is
// measured against a related tensor's magnitude); any of them may be on the GPU.
inline double rel_diff(const Tensor& got_gpu, const Tensor& want_any, const Tensor& scale_any) {
  // Copied to the host once each: item() on a GPU tensor is a device->host copy of one element.
  const Tensor got = got_gpu.to(Device::cpu()), want = want_any.to(Device::cpu()), scale = scale_any.to(Device::cpu());
  EXPECT_EQ(got.numel(), want.numel());
  double diff = 0, mag = 1e-30;
  for (int64_t i = 0; i < want.numel(); i++) diff = std::max(diff, std::fabs(got.item(i) - want.item(i)));
  for (int64_t i = 0; i < scale.numel(); i++) mag = std::max(mag, std::fabs(scale.item(i)));
  return diff / mag;
}
inline double rel_diff(const Tensor& got_gpu, const Tensor& want_any) {
  return rel_diff(got_gpu, want_any, want_any);
}

inline bool bitwise_equal(const Tensor& a_gpu, const Tensor& b_gpu) {
  const Tensor a = a_gpu.to(Device::cpu()), b = b_gpu.to(Device::cpu());
  return a.nbytes() == b.nbytes() &&
         std::equal(static_cast<const char*>(a.raw()), static_cast<const char*>(a.raw()) + a.nbytes(),
                    static_cast<const char*>(b.raw()));
}

}  // namespace moecore::testing_cuda
