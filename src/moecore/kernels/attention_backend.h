// Which kernels run the GPU's bf16 attention: cuDNN's fused scaled-dot-product attention
// (kernels/cuda/attention_cudnn*.cpp) or moecore's own tensor-core kernels (kernels/cuda/attention_tc*.cu). The
// decisions here are host logic only (the selector, the shapes cuDNN's path covers, the key of its plan cache), so they
// are tested without a GPU; running cuDNN is not here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moecore::kernels {

// kAuto: cuDNN where it is loaded and covers the call, else the native kernels. kCudnn: the same choice, for tests
// and benchmarks that want to say which path they mean (a call cuDNN cannot run still falls back, with its reason
// logged). kNative: never cuDNN.
enum class AttentionBackend { kAuto, kCudnn, kNative };

// "auto", "cudnn" or "native" (an empty string is auto); anything else is a user error naming the value.
AttentionBackend parse_attention_backend(std::string_view s);
const char* attention_backend_name(AttentionBackend b);
// The backend set by set_attention_backend, else MOECORE_ATTENTION_BACKEND's (read once), else kAuto.
AttentionBackend attention_backend();
void set_attention_backend(AttentionBackend b);

// One attention call as cuDNN's plan cache keys it: q [S, B, Nq, D], k [S, B, Nkv, D], v [S, B, Nkv, Dv] (Dv ≤ D:
// MLA's value heads, read from and written to the first Dv channels of rows D wide), causal or not, bf16 operands.
// `backward` tells the two graphs of a shape apart.
struct SdpaKey {
  int64_t B = 0, Nq = 0, Nkv = 0, S = 0, D = 0, Dv = 0;
  bool causal = true;
  bool bf16 = true;
  bool backward = false;
  bool operator==(const SdpaKey& o) const {
    return B == o.B && Nq == o.Nq && Nkv == o.Nkv && S == o.S && D == o.D && Dv == o.Dv && causal == o.causal &&
           bf16 == o.bf16 && backward == o.backward;
  }
  std::string str() const;
};
struct SdpaKeyHash {
  size_t operator()(const SdpaKey& k) const;
};

// What kind of attention call asks: the whole causal sequence (attention_forward_bf16 and its backward), with or
// without dropout, or a block of context parallelism at global offsets.
struct SdpaCall {
  SdpaKey key;
  bool dropout = false;
  bool cp_block = false;
};
// Whether cuDNN's path covers a call, and if not why (one line). Dropout keeps the native kernels: cuDNN draws its
// own Philox mask, not moecore's (kernels/dropout.h), so its masks would differ from the CPU's. Blocks of context
// parallelism keep them too (their spans and dq accumulation are not a cuDNN graph). Head dims: multiples of 8 up to
// 256 (cuDNN's fused attention's range; whether this cuDNN and GPU run a shape is known only when its plan is built,
// and a refusal there falls back too).
struct SdpaCoverage {
  bool covered = false;
  std::string why;
};
SdpaCoverage cudnn_sdpa_covers(const SdpaCall& call);

// The oldest cuDNN the path runs with (9.0: the backend API's fused attention with GQA, deterministic backward).
constexpr int64_t kMinCudnnVersion = 90000;
// cuDNN's version number (major·10000 + minor·100 + patch) as text, "9.19.0".
std::string cudnn_version_str(int64_t v);

// cuDNN's fused attention on this machine, for the benchmarks' reports: whether it loads (else why not, in `why`),
// the loaded version (0: none), and the calls it has run since the process started. A CPU-only build: never.
bool cudnn_attention_available(std::string* why);
int64_t cudnn_loaded_version();
struct CudnnAttentionCalls {
  int64_t forward = 0, backward = 0;
};
CudnnAttentionCalls cudnn_attention_calls();

}  // namespace moecore::kernels
