// The ops both kernel backends implement, declared once with the API's signatures (kernels/*.h document each op):
// kernels/cpu/kernels.h and kernels/cuda/kernels.h expand MOECORE_BACKEND_OPS inside their namespace, and each
// backend's tables (kernels/backends.h) list its definitions.
#pragma once

#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/dropout.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/grouped_gemm.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/mla_blocks.h"
#include "moecore/kernels/position_rows.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/kernels/rope.h"
#include "moecore/kernels/sgd_update.h"
#include "moecore/kernels/shared_gate.h"

#define MOECORE_BACKEND_OPS                                                                                            \
  void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta);         \
  void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta); \
  void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,                                   \
                    const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows,                           \
                    const ExpertWeightPacker* packed);                                                                 \
  void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK,                                     \
                          const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows, float beta);        \
  int64_t grouped_gemm_row_align();                                                                                    \
                                                                                                                       \
  /* elementwise.h */                                                                                                  \
  void add_(Tensor& a, const Tensor& b);                                                                               \
  void add(const Tensor& a, const Tensor& b, Tensor& out);                                                             \
  void scale_(Tensor& a, double s);                                                                                    \
  void fill_(Tensor& a, double v);                                                                                     \
  double sum(const Tensor& a);                                                                                         \
  double dot(const Tensor& a, const Tensor& b);                                                                        \
  double sum_squares(const Tensor& a);                                                                                 \
  int64_t count_zeros(const Tensor& a);                                                                                \
  void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN);              \
  void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,            \
                             const Tensor* b_EN, Tensor* dw_R);                                                        \
  void copy_cols(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols, int64_t dst_col, \
                 int64_t rows, int64_t cols);                                                                          \
                                                                                                                       \
  /* rmsnorm.h, layernorm.h */                                                                                         \
  void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T);               \
  void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,            \
                           Tensor& rstd_T);                                                                            \
  void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T,              \
                        Tensor& dx_TH, Tensor& dw_H, const Tensor* dres_TH);                                           \
  void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,           \
                         Tensor& mean_T, Tensor& rstd_T);                                                              \
  void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,     \
                             Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T);                                            \
  void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,            \
                          const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH);     \
                                                                                                                       \
  /* rope.h, activation.h, embedding.h */                                                                              \
  void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,               \
                       int64_t rot_dim, RopePairs pairs, Tensor& y_SBND);                                              \
  void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,             \
                        int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND);                                            \
  void activation_forward(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF);                       \
  void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,    \
                           Tensor* dprobs_T);                                                                          \
  void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start,                   \
                         int64_t vocab_total);                                                                         \
  void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start);               \
                                                                                                                       \
  /* cross_entropy.h */                                                                                                \
  void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T);         \
  void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,     \
                                            int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,           \
                                            Tensor& lse_T);                                                            \
  void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,                 \
                              const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start);                           \
  void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T,               \
                                      Tensor& loss_T, Tensor& lse_T);                                                  \
                                                                                                                       \
  /* adamw.h, sgd.h */                                                                                                 \
  void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step);       \
  void adamw_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step);                       \
  void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp);                                  \
                                                                                                                       \
  /* dropout.h (the shapes checked and p = 0 handled by the dispatch) */                                               \
  void dropout_forward(const Tensor& x_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,                \
                       int64_t seq_offset, Tensor& y_SBC);                                                             \
                                                                                                                       \
  /* The modules' small ops: position_rows.h, mla_blocks.h, shared_gate.h. */                                          \
  void position_add_rows(Tensor& h_nBH, const Tensor& table_nH);                                                       \
  void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH);                                                       \
  void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,      \
                      int64_t d0, int64_t w, int64_t rows);                                                            \
  void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH);                                          \
  void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T);
