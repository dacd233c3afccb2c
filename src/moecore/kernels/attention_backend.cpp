// The GPU attention backend's host decisions (attention_backend.h): the selector, cuDNN's coverage, the plan key.
#include "moecore/kernels/attention_backend.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <functional>

#include "moecore/core/error.h"
#include "moecore/kernels/cuda/attention_cudnn.h"
#include "moecore/kernels/cuda/attention_cudnn_api.h"

namespace moecore::kernels {

namespace {
// -1: not chosen yet (the environment decides on first use); else an AttentionBackend.
std::atomic<int> g_attention_backend{-1};
}  // namespace

AttentionBackend parse_attention_backend(std::string_view s) {
  if (s.empty() || s == "auto") return AttentionBackend::kAuto;
  if (s == "cudnn") return AttentionBackend::kCudnn;
  if (s == "native") return AttentionBackend::kNative;
  MOE_CHECK(false, "attention backend '{}' is not one of: auto, cudnn, native (MOECORE_ATTENTION_BACKEND)", s);
  return AttentionBackend::kAuto;
}

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::kAuto:
      return "auto";
    case AttentionBackend::kCudnn:
      return "cudnn";
    case AttentionBackend::kNative:
      return "native";
  }
  return "?";
}

AttentionBackend attention_backend() {
  int v = g_attention_backend.load();
  if (v < 0) {
    const char* env = std::getenv("MOECORE_ATTENTION_BACKEND");
    v = static_cast<int>(parse_attention_backend(env ? env : ""));
    g_attention_backend = v;
  }
  return static_cast<AttentionBackend>(v);
}

void set_attention_backend(AttentionBackend b) {
  g_attention_backend = static_cast<int>(b);
}

std::string SdpaKey::str() const {
  return fmt::format("{} B={} heads={}/{} S={} D={} Dv={} {}{}", backward ? "backward" : "forward", B, Nq, Nkv, S, D,
                     Dv, causal ? "causal" : "full", bf16 ? " bf16" : " f32");
}

size_t SdpaKeyHash::operator()(const SdpaKey& k) const {
  // Boost's hash_combine over the fields: the cache holds a handful of shapes, any spread will do.
  size_t h = 0;
  auto mix = [&h](int64_t x) { h ^= std::hash<int64_t>()(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (int64_t x : {k.B, k.Nq, k.Nkv, k.S, k.D, k.Dv}) mix(x);
  mix((k.causal ? 1 : 0) | (k.bf16 ? 2 : 0) | (k.backward ? 4 : 0));
  return h;
}

SdpaCoverage cudnn_sdpa_covers(const SdpaCall& call) {
  const SdpaKey& k = call.key;
  if (call.dropout) return {false, "attention dropout draws moecore's Philox mask, which cuDNN cannot"};
  if (call.cp_block) return {false, "context-parallel blocks run the native span kernels"};
  if (!k.bf16) return {false, "cuDNN's fused attention takes bf16 operands; the f32 path is the native kernel"};
  if (!k.causal) return {false, "only causal attention is wired to cuDNN"};
  if (k.B < 1 || k.S < 1 || k.Nkv < 1 || k.Nq % k.Nkv != 0)
    return {false, fmt::format("heads {}/{} with B={} S={}", k.Nq, k.Nkv, k.B, k.S)};
  if (k.D % 8 != 0 || k.D > 256) return {false, fmt::format("head dim {} is not a multiple of 8 up to 256", k.D)};
  if (k.Dv % 8 != 0 || k.Dv > k.D || k.Dv < 8)
    return {false, fmt::format("value head dim {} is not a multiple of 8 up to the head dim {}", k.Dv, k.D)};
  return {true, ""};
}

std::string cudnn_version_str(int64_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

bool cudnn_attention_available(std::string* why) {
  return cuda::cudnn_attention_available(why);
}
int64_t cudnn_loaded_version() {
  return cuda::cudnn_loaded_version();
}
CudnnAttentionCalls cudnn_attention_calls() {
  const cuda::CudnnAttentionCounts c = cuda::cudnn_attention_counts();
  return {c.forward, c.backward};
}

}  // namespace moecore::kernels
