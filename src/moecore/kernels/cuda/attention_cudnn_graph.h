// cuDNN's fused attention as backend-API operation graphs (attention_cudnn_graph.cpp): the forward and the
// deterministic backward of one SdpaKey built, planned and run. The Tensor-level entry points, the plan cache and
// the fallback are attention_cudnn.cpp's.
#pragma once

#include <memory>
#include <string>

#include "moecore/kernels/attention_backend.h"
#include "moecore/kernels/cuda/attention_cudnn_api.h"

#ifdef MOECORE_HAVE_CUDNN_HEADERS
namespace moecore::kernels::cuda {

// Layouts (moecore's, described to cuDNN by strides; no copies): q, dq [S, B, Nq, D]; k, dk [S, B, Nkv, D];
// v, dv [S, B, Nkv, D] and o, do [S, B, Nq, D] of which the first Dv channels are the values (the rest is MLA's
// zero padding: never read, and left as it is in o, dv); stats (lse) [B, Nq, S] f32; all but stats bf16.
// softmax_sum: [B, Nq, S] f32 scratch of the backward (Σ_d dO·O, cuDNN's name).
struct SdpaBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;  // forward: written; backward: read
  void* stats = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* softmax_sum = nullptr;
  float scale = 1.0f;
};

struct SdpaPlan;
struct SdpaPlanDeleter {
  void operator()(SdpaPlan* p) const;
};
using SdpaPlanPtr = std::unique_ptr<SdpaPlan, SdpaPlanDeleter>;

// The execution plan of `key`'s graph on `handle`'s GPU: the first engine cuDNN's heuristics rank that finalizes and
// carries no non-determinism note (the backward's graph is the form whose dQ is written by one matmul, which cuDNN
// runs without atomics). Null with `why` when cuDNN refuses the graph or has no deterministic engine for it.
SdpaPlanPtr build_sdpa_plan(const CudnnApi& api, cudnnHandle_t handle, const SdpaKey& key, std::string* why);
// Builds `key`'s operations (every tensor and operation descriptor finalized) without a handle or a GPU: what cuDNN
// checks of the graph before any engine is asked (attribute types, shapes, strides). False with `why` on a refusal.
bool sdpa_graph_operations_finalize(const CudnnApi& api, const SdpaKey& key, std::string* why);
int64_t sdpa_plan_workspace_bytes(const SdpaPlan& plan);
// Which engine the plan runs (cuDNN's global engine index), for the one line logged when a plan is built.
int64_t sdpa_plan_engine(const SdpaPlan& plan);
// Runs the plan on the handle's stream; `workspace`: sdpa_plan_workspace_bytes of device memory (null when 0).
// Throws moecore::Error naming the cuDNN call when cuDNN fails.
void run_sdpa_plan(const CudnnApi& api, cudnnHandle_t handle, const SdpaPlan& plan, const SdpaBuffers& buf,
                   void* workspace);

}  // namespace moecore::kernels::cuda
#endif
