// The layers' ops' entry points (rmsnorm.h, layernorm.h, rope.h, activation.h, embedding.h, cross_entropy.h,
// dropout.h, position_rows.h, mla_blocks.h, shared_gate.h): each calls its family's table for the tensors' device
// (dispatch.h, chosen in dispatch.cpp) inside the level-2 timer scope of its kind.
#include "moecore/core/timers.h"
#include "moecore/kernels/dispatch.h"
#include "moecore/kernels/rmsnorm.h"

namespace moecore::kernels {

// rmsnorm.h, layernorm.h: the backend of the input rows; each call is one `norm` timer scope (level 2).
void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  norms_on(x_TH.device()).rmsnorm_forward(x_TH, w_H, eps, y_TH, rstd_T);
}
void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                         Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  norms_on(x_TH.device()).rmsnorm_forward_add(x_TH, res_TH, w_H, eps, y_TH, rstd_T);
}
void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H, const Tensor* dres_TH) {
  TimerScope timer("norm", 2);
  norms_on(x_TH.device()).rmsnorm_backward(dy_TH, x_TH, w_H, rstd_T, dx_TH, dw_H, dres_TH);
}
void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                       Tensor& mean_T, Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  norms_on(x_TH.device()).layernorm_forward(x_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}
void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                           Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  norms_on(x_TH.device()).layernorm_forward_add(x_TH, res_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}
void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                        const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH) {
  TimerScope timer("norm", 2);
  norms_on(x_TH.device()).layernorm_backward(dy_TH, x_TH, w_H, mean_T, rstd_T, dx_TH, dw_H, db_H, dres_TH);
}

// rope.h: the backend of the rows; one `rope` timer scope (level 2) per call.
void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND) {
  TimerScope timer("rope", 2);
  rope_on(x_SBND.device()).forward_at(x_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, y_SBND);
}
void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND) {
  TimerScope timer("rope", 2);
  rope_on(dy_SBND.device()).backward_at(dy_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, dx_SBND);
}
void rope_forward(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& y_SBND) {
  rope_forward_at(x_SBND, cos_SR, sin_SR, 0, rot_dim, RopePairs::RotateHalf, y_SBND);
}
void rope_backward(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim,
                   Tensor& dx_SBND) {
  rope_backward_at(dy_SBND, cos_SR, sin_SR, 0, rot_dim, RopePairs::RotateHalf, dx_SBND);
}

// activation.h: the backend of the input; one `activation` timer scope (level 2) per call.
void activation_forward(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF) {
  TimerScope timer("activation", 2);
  activation_on(x.device()).forward(act, x, probs_T, y_TF);
}
void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                         Tensor* dprobs_T) {
  TimerScope timer("activation", 2);
  activation_on(x.device()).backward(act, dy_TF, x, probs_T, dx, dprobs_T);
}

// embedding.h: the backend of the table (ids may be read from either side); one `embedding` timer scope (level 2).
void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start,
                       int64_t vocab_total) {
  TimerScope timer("embedding", 2);
  embedding_on(w_VH.device()).forward(ids_T, w_VH, y_TH, vocab_start, vocab_total);
}
void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start) {
  TimerScope timer("embedding", 2);
  embedding_on(dw_VH.device()).backward(dy_TH, ids_T, dw_VH, vocab_start);
}

// cross_entropy.h: the backend of the logits; one `loss` timer scope (level 2) per call.
void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T) {
  TimerScope timer("loss", 2);
  cross_entropy_on(logits_TV.device()).forward(logits_TV, targets_T, loss_T, lse_T);
}
void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T) {
  TimerScope timer("loss", 2);
  cross_entropy_on(logits_TV.device())
      .forward_vocab_parallel(logits_TV, targets_T, vocab_start, vocab_total, all_reduce, loss_T, lse_T);
}
void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start) {
  TimerScope timer("loss", 2);
  cross_entropy_on(logits_TV.device()).backward(dloss_T, logits_TV, targets_T, lse_T, dlogits_TV, vocab_start);
}
void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                                    Tensor& lse_T) {
  TimerScope timer("loss", 2);
  cross_entropy_on(logits_TV.device()).forward_backward(logits_TV, targets_T, dloss_T, loss_T, lse_T);
}

// dropout.h: the backend of the input; one `dropout` timer scope (level 2) per call. p = 0 copies (or leaves in place).
void dropout_forward(const Tensor& x_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                     int64_t seq_offset, Tensor& y_SBC) {
  TimerScope timer("dropout", 2);
  const int64_t B = static_cast<int64_t>(sample_B.size());
  MOE_ASSERT(B > 0 && x_SBC.numel() > 0 && x_SBC.shape() == y_SBC.shape() && x_SBC.dtype() == y_SBC.dtype());
  MOE_ASSERT(x_SBC.device() == y_SBC.device());
  const int64_t C = x_SBC.dim(x_SBC.ndim() - 1), rows = x_SBC.numel() / C;
  MOE_ASSERT_MSG(rows % B == 0, "dropout over {} rows of {} samples", rows, B);
  if (!m.on()) {
    if (y_SBC.raw() != x_SBC.raw()) y_SBC.copy_from(x_SBC);
    return;
  }
  dropout_on(x_SBC.device()).forward(x_SBC, m, sample_B, seq_offset, y_SBC);
}
// dx = dy ⊙ z: the forward on the gradient, its mask regenerated.
void dropout_backward(const Tensor& dy_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                      int64_t seq_offset, Tensor& dx_SBC) {
  dropout_forward(dy_SBC, m, sample_B, seq_offset, dx_SBC);
}

// position_rows.h, mla_blocks.h, shared_gate.h: the backend of the rows they write into or read.
void position_add_rows(Tensor& h_nBH, const Tensor& table_nH) {
  position_rows_on(h_nBH.device()).add_rows(h_nBH, table_nH);
}
void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH) {
  position_rows_on(dh_nBH.device()).sum_rows(dh_nBH, grad_nH);
}
void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows) {
  mla_blocks_on(src.device()).move_block(src, Ns, Ws, s0, dst, Nd, Wd, d0, w, rows);
}
void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH) {
  shared_gate_on(m_TH.device()).forward(gate_T, m_TH, y_TH);
}
void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T) {
  shared_gate_on(dy_TH.device()).backward(dy_TH, gate_T, m_TH, dm_TH, dz_T);
}

}  // namespace moecore::kernels
