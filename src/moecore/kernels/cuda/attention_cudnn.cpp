// cuDNN's fused attention at the Tensor level (attention_cudnn.h): the route decision with its one-line reasons, one
// cuDNN handle per GPU, the execution plans cached per shape (SdpaKey), bf16 operands and workspace from the caching
// allocator. Not here: the graphs (attention_cudnn_graph.cpp) and loading cuDNN (attention_cudnn_api.cpp).
#include "moecore/kernels/cuda/attention_cudnn.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/attention_backend.h"
#include "moecore/kernels/cuda/attention_cudnn_api.h"
#include "moecore/kernels/cuda/attention_cudnn_graph.h"

namespace moecore::kernels::cuda {

namespace {

std::atomic<int64_t> g_cudnn_forward_calls{0}, g_cudnn_backward_calls{0};

// Prints `line` once per process (the route's reasons: which path runs, and why not cuDNN).
void print_attention_route_once(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> printed;
  const std::lock_guard<std::mutex> lock(mu);
  if (printed.insert(line).second) fmt::print(stderr, "moecore: attention: {}\n", line);
}

#ifdef MOECORE_HAVE_CUDNN_HEADERS
// One GPU's cuDNN handle and plans. A null plan records a shape cuDNN refused (asked once, then the native kernels).
struct CudnnDeviceState {
  cudnnHandle_t handle = nullptr;
  std::string handle_error;  // why cudnnCreate failed on this GPU
  std::unordered_map<SdpaKey, SdpaPlanPtr, SdpaKeyHash> plans;
};

std::mutex g_cudnn_mu;
std::map<int, CudnnDeviceState>& cudnn_devices() {
  static std::map<int, CudnnDeviceState> devices;  // handles live to the process's end (cuDNN's own advice)
  return devices;
}

// The current GPU's state with its handle created (under g_cudnn_mu); null with `why` when cuDNN is not usable.
CudnnDeviceState* cudnn_device(const CudnnApi** api_out, std::string* why) {
  const CudnnApi* api = cudnn_api(why);
  if (!api) return nullptr;
  int dev = 0;
  const cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // consumed: a later CUDA call must not see this one's error
    if (why) *why = fmt::format("cudaGetDevice: {}", cudaGetErrorString(e));
    return nullptr;
  }
  CudnnDeviceState& st = cudnn_devices()[dev];
  if (!st.handle && st.handle_error.empty()) {
    const cudnnStatus_t s = api->Create(&st.handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      (void)cudaGetLastError();  // whatever CUDA error cuDNN met stays out of the next launch check
      st.handle = nullptr;
      st.handle_error = fmt::format("{} on GPU {}", cudnn_error_text(*api, "cudnnCreate", s), dev);
    }
  }
  if (!st.handle) {
    if (why) *why = st.handle_error;
    return nullptr;
  }
  *api_out = api;
  return &st;
}
#endif

// Whether this call goes to cuDNN; prints which path runs the first time each answer (and reason) comes up.
bool route_to_cudnn(const SdpaCall& call) {
  const AttentionBackend b = attention_backend();
  if (b == AttentionBackend::kNative) {
    print_attention_route_once("native tensor-core kernels (attention backend: native)");
    return false;
  }
  const SdpaCoverage cov = cudnn_sdpa_covers(call);
  if (!cov.covered) {
    print_attention_route_once(fmt::format("native kernels where {}", cov.why));
    return false;
  }
  std::string why;
  if (!cudnn_attention_available(&why)) {
    print_attention_route_once(fmt::format("native kernels: cuDNN is unavailable: {}", why));
    return false;
  }
  print_attention_route_once(fmt::format("cuDNN {} fused attention (backend: {}) for bf16 causal attention",
                                         cudnn_version_str(cudnn_loaded_version()), attention_backend_name(b)));
  return true;
}

SdpaCall sdpa_attention_call(const AttentionDims& d, int64_t Dv, bool backward, const AttentionDropout* dropout) {
  SdpaCall c;
  c.key = SdpaKey{d.B, d.Nq, d.Nkv, d.S, d.D, Dv, true, true, backward};
  c.dropout = dropout && dropout->on();
  return c;
}

#ifdef MOECORE_HAVE_CUDNN_HEADERS
// Runs `key`'s plan (built on first use) over `buf`; false when cuDNN refuses the shape (reason printed once).
bool run_cached_sdpa(const SdpaKey& key, SdpaBuffers buf, Device dev) {
  const CudnnApi* api = nullptr;
  const SdpaPlan* plan = nullptr;
  cudnnHandle_t handle = nullptr;
  std::string why;
  {
    const std::lock_guard<std::mutex> lock(g_cudnn_mu);
    CudnnDeviceState* st = cudnn_device(&api, &why);
    if (!st) {
      print_attention_route_once(fmt::format("native kernels: cuDNN is unavailable: {}", why));
      return false;
    }
    auto it = st->plans.find(key);
    if (it == st->plans.end()) {
      SdpaPlanPtr p = build_sdpa_plan(*api, st->handle, key, &why);
      if (p)
        print_attention_route_once(fmt::format("cuDNN plan for {}: engine {}, workspace {} MiB", key.str(),
                                               sdpa_plan_engine(*p), sdpa_plan_workspace_bytes(*p) >> 20));
      else
        print_attention_route_once(fmt::format("native kernels for {}: cuDNN refuses it: {}", key.str(), why));
      it = st->plans.emplace(key, std::move(p)).first;
    }
    plan = it->second.get();
    handle = st->handle;
  }
  if (!plan) return false;
  const int64_t ws_bytes = sdpa_plan_workspace_bytes(*plan);
  // Workspace from the caching allocator on the current stream: freed when this call returns, reused by the next.
  Tensor ws = ws_bytes > 0 ? Tensor::empty({(ws_bytes + 3) / 4}, DType::F32, dev) : Tensor();
  const cudnnStatus_t s = api->SetStream(handle, moecore::device::current_stream());
  MOE_CHECK(s == CUDNN_STATUS_SUCCESS, "{}", cudnn_error_text(*api, "cudnnSetStream", s));
  run_sdpa_plan(*api, handle, *plan, buf, ws_bytes > 0 ? ws.raw() : nullptr);
  return true;
}
#endif

// A bf16 copy of a GPU f32 operand (moecore's GPU tensors are f32; cuDNN reads bf16).
Tensor cudnn_bf16_operand(const Tensor& t) {
  MOE_ASSERT_MSG(t.device().is_cuda() && t.dtype() == DType::F32, "cuDNN attention operand is {} on {}",
                 dtype_name(t.dtype()), t.device().str());
  return t.to(DType::BF16);
}
// A bf16 result buffer shaped like `t`; zeroed where cuDNN writes only the first Dv < D channels.
Tensor cudnn_bf16_result(const Tensor& t, bool zero) {
  return zero ? Tensor::zeros(t.shape(), DType::BF16, t.device()) : Tensor::empty(t.shape(), DType::BF16, t.device());
}

}  // namespace

#ifdef MOECORE_HAVE_CUDNN_HEADERS
bool cudnn_attention_available(std::string* why) {
  const std::lock_guard<std::mutex> lock(g_cudnn_mu);
  const CudnnApi* api = nullptr;
  return cudnn_device(&api, why) != nullptr;
}
#endif

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Dv, double scale, Tensor& o,
                             Tensor& lse, const AttentionDropout* dropout) {
  const AttentionDims d = attention_forward_dims(q, k, v, o, lse);
  const SdpaCall call = sdpa_attention_call(d, Dv, false, dropout);
  if (!route_to_cudnn(call)) return false;
#ifdef MOECORE_HAVE_CUDNN_HEADERS
  const moecore::device::PhaseScope phase(moecore::device::Phase::kAttention);
  const Tensor qb = cudnn_bf16_operand(q), kb = cudnn_bf16_operand(k), vb = cudnn_bf16_operand(v);
  Tensor ob = cudnn_bf16_result(o, Dv < d.D);
  SdpaBuffers buf;
  buf.q = qb.raw(), buf.k = kb.raw(), buf.v = vb.raw(), buf.o = ob.raw(), buf.stats = lse.raw();
  buf.scale = static_cast<float>(scale);
  if (!run_cached_sdpa(call.key, buf, q.device())) return false;
  o.copy_from(ob);
  g_cudnn_forward_calls++;
  return true;
#else
  return false;
#endif
}

bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t Dv, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                              const AttentionDropout* dropout) {
  const AttentionDims d = attention_backward_dims(dout, q, k, v, o, lse, dq, dk, dv);
  const SdpaCall call = sdpa_attention_call(d, Dv, true, dropout);
  if (!route_to_cudnn(call)) return false;
#ifdef MOECORE_HAVE_CUDNN_HEADERS
  const moecore::device::PhaseScope phase(moecore::device::Phase::kAttention);
  MOE_ASSERT(lse.dtype() == DType::F32 && lse.device().is_cuda());
  const Tensor qb = cudnn_bf16_operand(q), kb = cudnn_bf16_operand(k), vb = cudnn_bf16_operand(v);
  const Tensor ob = cudnn_bf16_operand(o), dob = cudnn_bf16_operand(dout);
  Tensor dqb = cudnn_bf16_result(dq, false), dkb = cudnn_bf16_result(dk, false), dvb = cudnn_bf16_result(dv, Dv < d.D);
  Tensor softmax_sum = Tensor::empty({d.B, d.Nq, d.S}, DType::F32, q.device());
  SdpaBuffers buf;
  buf.q = qb.raw(), buf.k = kb.raw(), buf.v = vb.raw(), buf.o = ob.raw(), buf.stats = lse.raw();
  buf.dout = dob.raw(), buf.dq = dqb.raw(), buf.dk = dkb.raw(), buf.dv = dvb.raw();
  buf.softmax_sum = softmax_sum.raw();
  buf.scale = static_cast<float>(scale);
  if (!run_cached_sdpa(call.key, buf, q.device())) return false;
  dq.copy_from(dqb);
  dk.copy_from(dkb);
  dv.copy_from(dvb);
  g_cudnn_backward_calls++;
  return true;
#else
  return false;
#endif
}

CudnnAttentionCounts cudnn_attention_counts() {
  return {g_cudnn_forward_calls.load(), g_cudnn_backward_calls.load()};
}

}  // namespace moecore::kernels::cuda
