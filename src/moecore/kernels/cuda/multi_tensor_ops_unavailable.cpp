// kernels/cuda/multi_tensor_ops.h in a CPU-only build: no CUDA tensor can exist there, so a correct caller never
// reaches these; one that does gets the build's "without CUDA" message.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/multi_tensor_ops.h"

namespace moecore::kernels::cuda {

void clip_state_init(ClipState&) {
  ::moecore::device::no_cuda_kernel("clip_state_init");
}
void squares_reset(ClipState&) {
  ::moecore::device::no_cuda_kernel("squares_reset");
}
void squares_add_part(ClipState&, std::span<const Tensor>, std::span<const double>) {
  ::moecore::device::no_cuda_kernel("squares_add_part");
}
void clip_finish(ClipState&, bool, double, double, bool, int64_t, bool) {
  ::moecore::device::no_cuda_kernel("clip_finish");
}
void sgd_step_multi(std::vector<AdamWTensor>&, const AdamWParams&, double) {
  ::moecore::device::no_cuda_kernel("sgd_step_multi");
}
void record_bad_ids(const Tensor&, int64_t, int) {
  ::moecore::device::no_cuda_kernel("record_bad_ids");
}
void set_id_check_iteration(int64_t) {}
BadId take_bad_id() {
  return {-1, 0, 0, 0, 0};  // no GPU: nothing was recorded
}

}  // namespace moecore::kernels::cuda
