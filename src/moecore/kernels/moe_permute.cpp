// The MoE permutation's ops (see moe_permute.h): each calls the permutation table kernels/dispatch.cpp picks by where
// its tensors live, and times the permutation ("moe-permute", level 2, which bench train's phase table reads).
#include "moecore/kernels/moe_permute.h"

#include "moecore/core/timers.h"
#include "moecore/kernels/dispatch.h"

namespace moecore::kernels {

void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align,
                      PermutePlan& plan) {
  TimerScope timer("moe-permute", 2);
  const Device d = idx_TK.device();
  if (d.is_cpu() || pad_capacity == 0) return moe_permute_on(d).plan(idx_TK, E, pad_capacity, block, row_align, plan);
  MOE_ASSERT_MSG(row_align == 1, "the GPU experts take rows back to back, asked for a {}-row alignment", row_align);
  // --moe-pad-expert-input-to-capacity: the padding rule (fill each expert from the earliest tokens without a row
  // for it) runs on a host copy of the ids and the plan moves to the GPU. A second host synchronisation, only under
  // padding (its row counts are fixed, so nothing else needs them).
  moe_permute_on(Device::cpu()).plan(idx_TK.to(Device::cpu()), E, pad_capacity, block, 1, plan);
  plan.row_token_R = plan.row_token_R.to(d);
  plan.row_tk_R = plan.row_tk_R.to(d);
  plan.token_offsets_T1 = plan.token_offsets_T1.to(d);
  plan.token_rows = plan.token_rows.to(d);
  plan.token_cursor_T = Tensor();
}

void moe_gather_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst) {
  TimerScope timer("moe-permute", 2);
  moe_permute_on(src.device()).gather_rows(src, idx_R, dst);
}

void moe_scatter_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst) {
  TimerScope timer("moe-permute", 2);
  moe_permute_on(src.device()).scatter_rows(src, idx_R, dst);
}

void moe_sum_rows_per_token(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,
                            Tensor& dst_TH) {
  TimerScope timer("moe-permute", 2);
  moe_permute_on(src_RH.device()).sum_rows_per_token(src_RH, token_offsets_T1, token_rows, dst_TH);
}

DType moe_row_sum_dtype(DType rows) {
  return is_half(rows) ? DType::F32 : rows;
}

void moe_gather_probs(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R) {
  moe_permute_on(probs_TK.device()).gather_probs(probs_TK, row_tk_R, probs_R);
}

void moe_scatter_probs(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK) {
  moe_permute_on(dprobs_R.device()).scatter_probs(dprobs_R, row_tk_R, dprobs_TK);
}

int64_t align_up(int64_t n, int64_t align) {
  return (n + align - 1) / align * align;
}

Tensor padded_rows_empty(int64_t rows, int64_t experts, int64_t align, int64_t padded, int64_t C, DType dtype,
                         Device device) {
  const int64_t capacity = align > 1 ? rows + experts * (align - 1) : rows;
  MOE_ASSERT(padded <= capacity);
  return Tensor::empty({capacity, C}, dtype, device).slice(0, padded);
}

}  // namespace moecore::kernels
