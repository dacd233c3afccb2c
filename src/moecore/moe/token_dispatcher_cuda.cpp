// The token dispatchers' GPU path (see token_dispatcher.h): the plan built on the GPU (kernels/cuda/moe_kernels.h),
// the same rows, order and sums as the CPU path. Compiled in every build: a CPU-only build's kernels throw
// (kernels/cuda/moe_kernels_unavailable.cpp), and no CUDA tensor can reach them there.
#include "moecore/core/timers.h"
#include "moecore/kernels/cuda/moe_kernels.h"
#include "moecore/moe/token_dispatcher.h"

namespace moecore::moe {

void LocalTokenDispatcher::permute_cuda(const Tensor& x_TH, const Tensor& idx_TK, const Tensor& probs_TK,
                                        int64_t pad_capacity, int64_t block, int64_t row_align, DispatchPlan& plan,
                                        Tensor& x_RH, Tensor& probs_R) const {
  TimerScope timer("moe-permute", 2);
  MOE_ASSERT_MSG(row_align == 1, "the GPU experts take rows back to back, asked for a {}-row alignment", row_align);
  const Device d = x_TH.device();
  const int64_t T = idx_TK.dim(0), K = idx_TK.dim(1), H = x_TH.cols();
  MOE_ASSERT_MSG(idx_TK.device() == d && probs_TK.device() == d, "dispatch on {}: the routing is on {} and {}", d.str(),
                 idx_TK.device().str(), probs_TK.device().str());
  MOE_ASSERT_MSG(probs_TK.dtype() == DType::F32, "the GPU dispatch takes f32 router probabilities, got {}",
                 dtype_name(probs_TK.dtype()));
  MOE_ASSERT(x_TH.rows() == T && probs_TK.numel() == T * K);
  if (pad_capacity > 0) {
    // --moe-pad-expert-input-to-capacity: the padding rule (fill each expert from the earliest tokens without a row
    // for it) runs on host copies of the [T, K] routing through the CPU plan builder, and the plan moves to the GPU.
    // A second host synchronisation, only under padding (its row counts are fixed, so nothing else needs them).
    Tensor none_RH, probs_host;
    permute(Tensor::empty({T, 0}, DType::F32), idx_TK.to(Device::cpu()), probs_TK.to(Device::cpu()), pad_capacity,
            block, /*row_align=*/1, plan, none_RH, probs_host);
    plan.row_token_R = plan.row_token_R.to(d);
    plan.row_tk_R = plan.row_tk_R.to(d);
    plan.token_offsets_T1 = plan.token_offsets_T1.to(d);
    plan.token_rows = plan.token_rows.to(d);
    plan.token_cursor_T = Tensor();
    probs_R = probs_host.to(d);
  } else {
    plan.T = T;
    plan.E = E_;
    plan.K = K;
    kernels::cuda::moe_build_plan(idx_TK, E_, plan.tokens_per_expert, plan.row_token_R, plan.row_tk_R,
                                  plan.token_offsets_T1, plan.token_rows);
    plan.R = plan.row_token_R.numel();
    probs_R = Tensor::empty({plan.R}, DType::F32, d);
    kernels::cuda::moe_gather_probs(probs_TK, plan.row_tk_R, probs_R);
  }
  x_RH = Tensor::empty({plan.R, H}, x_TH.dtype(), d);
  kernels::cuda::moe_gather_rows(x_TH, plan.row_token_R, x_RH);
}

void scatter_dprobs_cuda(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK) {
  MOE_ASSERT_MSG(dprobs_TK.dtype() == DType::F32, "the GPU dispatch writes f32 probability gradients, asked for {}",
                 dtype_name(dprobs_TK.dtype()));
  kernels::cuda::moe_scatter_probs(dprobs_R.reshape({dprobs_R.numel()}), row_tk_R, dprobs_TK);
}

}  // namespace moecore::moe
