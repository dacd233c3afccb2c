// The CPU-only build's stand-in for cuDNN's fused attention (attention_cudnn.h): never available, so every caller
// takes the native path (which in this build is itself unavailable and says so).
#include "moecore/kernels/cuda/attention_cudnn.h"
#include "moecore/kernels/cuda/attention_cudnn_api.h"

namespace moecore::kernels::cuda {

bool cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, int64_t, double, Tensor&, Tensor&,
                             const AttentionDropout*) {
  return false;
}
bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              int64_t, double, Tensor&, Tensor&, Tensor&, const AttentionDropout*) {
  return false;
}
CudnnAttentionCounts cudnn_attention_counts() {
  return {};
}
bool cudnn_attention_available(std::string* why) {
  if (why) *why = "this moecore was built without CUDA";
  return false;
}
int64_t cudnn_loaded_version() {
  return 0;
}

}  // namespace moecore::kernels::cuda
