// The CPU's attention kernels by name (see attention_named.h): each call goes to the kernel it names.
#include "moecore/kernels/attention_named.h"

#include "moecore/kernels/cpu/attention_flash.h"
#include "moecore/kernels/cpu/attention_flash_native.h"

namespace moecore::kernels {

bool has_native_bf16_attention() {
  return flash::has_native_bf16();
}

std::string native_bf16_attention_name() {
  return flash::native_bf16_name(flash::best_native_bf16());
}

void attention_forward_named(Bf16AttentionKernel kind, const Tensor& q, const Tensor& k, const Tensor& v,
                             int64_t block_q0, double scale, Tensor& o, Tensor& lse, const AttentionDropout* dropout,
                             const AttentionRope* rope) {
  MOE_ASSERT_MSG(block_q0 < 0 || kind != Bf16AttentionKernel::OneDnn, "the oneDNN attention has no block form");
  if (block_q0 >= 0 && kind == Bf16AttentionKernel::FlashNative)
    return flash::block_forward_native(q, k, v, block_q0, 0, scale, o, lse, dropout, flash::best_native_bf16());
  if (block_q0 >= 0) return flash::block_forward_rounded(q, k, v, block_q0, 0, scale, o, lse, dropout);
  if (kind == Bf16AttentionKernel::OneDnn) return attention_forward_bf16_onednn(q, k, v, scale, o, lse, dropout);
  if (kind == Bf16AttentionKernel::FlashNative)
    return flash::forward_native(q, k, v, scale, o, lse, dropout, flash::best_native_bf16(), rope);
  flash::forward(q, k, v, scale, o, lse, dropout, /*round_bf16=*/true);
}

void attention_backward_named(Bf16AttentionKernel kind, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& o, const Tensor& lse, int64_t block_q0, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout* dropout,
                              const AttentionRope* rope) {
  MOE_ASSERT_MSG(block_q0 < 0 || kind != Bf16AttentionKernel::OneDnn, "the oneDNN attention has no block form");
  if (block_q0 >= 0 && kind == Bf16AttentionKernel::FlashNative)
    return flash::block_backward_native(dout, q, k, v, o, lse, block_q0, 0, scale, dq, dk, dv, dropout,
                                        flash::best_native_bf16());
  if (block_q0 >= 0)
    return flash::block_backward_rounded(dout, q, k, v, o, lse, block_q0, 0, scale, dq, dk, dv, dropout);
  if (kind == Bf16AttentionKernel::OneDnn)
    return attention_backward_bf16_onednn(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
  if (kind == Bf16AttentionKernel::FlashNative)
    return flash::backward_native(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, flash::best_native_bf16(), rope);
  flash::backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, /*round_bf16=*/true);
}

}  // namespace moecore::kernels
