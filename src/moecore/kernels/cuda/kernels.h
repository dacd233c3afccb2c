// The CUDA kernels at the Tensor level, with the API's signatures (kernels/*.h, which documents each) like the CPU
// backend's (kernels/cpu/kernels.h): the dispatch code (kernels/dispatch.cpp) calls these for tensors on a GPU, so
// nn/ and moe/ run unchanged. Where the GPU has no fused kernel for a form the API offers, the wrapper here composes
// it from the kernels it has (gemm_batched, the norms' fused forms, the fused cross-entropy, multi-tensor AdamW; each
// such wrapper says so). Element types: f32 everywhere (as the CPU kernels compute), gemm operands f32 or bf16 with an
// f32 output; the bf16 attention takes f32 tensors and rounds inside, like the CPU one. A CPU-only build defines these
// in kernels/cuda/kernels_unavailable.cpp (they throw: no cuda tensor can exist there).
#pragma once

#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/adamw.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/rope.h"

namespace moecore::kernels::cuda {

// C = alpha·op(A)·op(B) + beta·C through cuBLASLt (handle, descriptors, algorithm and workspace cached per shape).
// f32 operands compute in f32 (TF32 off unless set_allow_tf32(true)); bf16 operands accumulate in f32.
void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta);
// [batch, rows, cols] operands in one strided-batched cuBLASLt call.
void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta);
void set_allow_tf32(bool on);
bool allow_tf32();

void add_(Tensor& a, const Tensor& b);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void scale_(Tensor& a, double s);
void fill_(Tensor& a, double v);
double sum(const Tensor& a);
double dot(const Tensor& a, const Tensor& b);
double sum_squares(const Tensor& a);

// The norms: one kernel for f32 rows; a bf16 y_TH is the f32 result cast, the residual add (the _add forms) and
// dres_TH are add_ calls before and after the kernel (the same values as the CPU's fused forms, not fused).
void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T);
void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                         Tensor& rstd_T);
void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H, const Tensor* dres_TH);
void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                       Tensor& mean_T, Tensor& rstd_T);
void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                           Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T);
void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                        const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH);
// y f32; dy f32 or bf16; one launch per segment with rows (the segments are the experts' rows, known on the host).
void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN);
void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                           const Tensor* b_EN, Tensor* dw_R);
void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND);
void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND);
void activation_forward(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF);
void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                         Tensor* dprobs_T);
void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start, int64_t vocab_total);
void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start);

void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T);
// The all-reduces run on host copies of the [T] statistics (host-staged MPI; NCCL comes later).
void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T);
void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start);
// The forward, then the backward writing over the logits (no fused kernel on the GPU).
void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                                    Tensor& lse_T);

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step);
// Every tensor of the lists in as few launches as possible (kernels/cuda/launch.h kAdamTensors per launch).
struct AdamWTensors {
  Tensor* param;
  const Tensor* grad;
  Tensor* m;
  Tensor* v;
};
void adamw_multi_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& hp, int64_t step);
// adamw.h's multi-tensor form: one adamw_step per tensor, each with its own weight decay (param_bf16 is a CPU copy
// and is not written here).
void adamw_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step);

// dropout.h on f32 rows (the shapes checked and p = 0 handled by the dispatch): the CPU kernel's mask, bit for bit
// (dropout.cu). Micro-batches of up to launch_dropout.h's kDropoutMaxSamples sequences.
void dropout_forward(const Tensor& x_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                     int64_t seq_offset, Tensor& y_SBC);

// Attention (f32 tensors): the _bf16 forms round the GEMM operands to bf16 inside, like the CPU's, and take no RoPE
// (only the CPU's FlashNative kernel applies it). Attention dropout inside the kernels, with the CPU's keep bits.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout);
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout, const AttentionRope* rope);
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout, const AttentionRope* rope);

}  // namespace moecore::kernels::cuda
