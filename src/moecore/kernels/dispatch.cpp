// The one place each op picks its backend: the API's entry points (kernels/*.h) send tensors in host memory to the
// CPU kernels and tensors on a GPU to the CUDA kernels: an op family's backend table (kernels/backends.h; a CPU-only
// build has no GPU tables, and a GPU tensor, which no correct caller has there, gets the build's message here), or
// the per-op functions of kernels/cpu/kernels.h and kernels/cuda/kernels.h (a CPU-only build links their stand-ins).
// Each backend checks its own operands; what happens here besides the choice is the level-2 timer scope some ops open
// around either backend. Ops with only a CPU kernel are not listed (kernels/cpu defines them under their API names).
#include "moecore/core/timers.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/backend.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/dropout.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/embedding.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/grouped_gemm.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/mla_blocks.h"
#include "moecore/kernels/position_rows.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/kernels/rope.h"
#include "moecore/kernels/routing.h"
#include "moecore/kernels/sgd_update.h"
#include "moecore/kernels/shared_gate.h"

namespace moecore::kernels {

// backend.h: the CPU's kernels (oneDNN, the FlashNative attention, the fused loss) and the GPU's.
const BackendOffers& backend_offers(Device d) {
  static const BackendOffers cpu_offers{.gemm_bf16_output = true,
                                        .attention_bf16_tensors = true,
                                        .fused_loss_backward = true,
                                        .lazy_grad_zero = true,
                                        .update_writes_bf16_copy = true,
                                        .norm_on_host = true};
  static const BackendOffers cuda_offers{};
  return d.is_cuda() ? cuda_offers : cpu_offers;
}

namespace {
// The backend table for tensors on `d`: the CPU's, or the GPU's where the build has one.
template <typename Table>
const Table& backend_for(Device d, const Table& cpu_table, const Table* cuda_table, const char* op) {
  if (!d.is_cuda()) return cpu_table;
  if (!cuda_table) moecore::device::no_cuda_kernel(op);
  return *cuda_table;
}
#ifdef MOECORE_HAVE_CUDA
#define MOECORE_CUDA_TABLE(name) (&cuda::name)
#else
#define MOECORE_CUDA_TABLE(name) (static_cast<decltype(&cpu::name)>(nullptr))
#endif

const RouterKernels& router_on(Device d) {
  return backend_for(d, cpu::kRouterKernels, MOECORE_CUDA_TABLE(kRouterKernels), "router");
}
const AttentionKernels& attention_on(Device d) {
  return backend_for(d, cpu::kAttentionKernels, MOECORE_CUDA_TABLE(kAttentionKernels), "attention");
}
}  // namespace

// router.h: the backend of the router's tensors.
void router_check_backend(Device device, DType router_dtype) {
  router_on(device).check_backend(router_dtype);
}
void router_rows(const RouterRule& rule, RouterRows& r) {
  router_on(r.used_TE.device()).rows(rule, r);
}
void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad) {
  router_on(idx_TK.device()).capacity(idx_TK, probs_TK, kept_TK, E, C, by_position, pad);
}
void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK) {
  router_on(idx_TK.device()).mask_ids(idx_TK, kept_TK, ids_TK);
}
void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E) {
  router_on(ids_TK.device()).expert_counts(ids_TK, counts_E);
}
void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE) {
  router_on(a_TE.device()).aux_counts(a_TE, top_TK, G, cnt_GE, agg_GE);
}
void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE) {
  router_on(da_TE.device()).add_class_coef(da_TE, coef_GE);
}
void router_mul_(Tensor& a, const Tensor& u) {
  router_on(a.device()).mul_(a, u);
}
void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE) {
  router_on(dl_TE.device()).score_backward(rule, dprobs_TK, idx_TK, kept_TK, p_TK, scores_TE, dl_TE);
}
void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE) {
  router_on(dl_TE.device()).aux_score_backward(sigmoid, used_TE, a_TE, da_TE, scale, dl_TE);
}
void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE) {
  router_on(dl_TE.device()).z_loss_backward(logits_TE, lse_T, f, dl_TE);
}

// gemm.h: the backend of the operands (C and B live beside A).
void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  if (A.device().is_cuda()) return cuda::gemm(A, trans_a, B, trans_b, C, alpha, beta);
  cpu::gemm(A, trans_a, B, trans_b, C, alpha, beta);
}
void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  if (A.device().is_cuda()) return cuda::gemm_batched(A, trans_a, B, trans_b, C, alpha, beta);
  cpu::gemm_batched(A, trans_a, B, trans_b, C, alpha, beta);
}
void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows,
                  const ExpertWeightPacker* packed) {
  if (A_RK.device().is_cuda()) return cuda::grouped_gemm(A_RK, W, trans_w, C_RN, row_begin, rows, packed);
  cpu::grouped_gemm(A_RK, W, trans_w, C_RN, row_begin, rows, packed);
}
void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows, float beta) {
  if (dY_RN.device().is_cuda()) return cuda::grouped_gemm_wgrad(dY_RN, X_RK, dW_ENK, row_begin, rows, beta);
  cpu::grouped_gemm_wgrad(dY_RN, X_RK, dW_ENK, row_begin, rows, beta);
}
int64_t grouped_gemm_row_align(Device d) {
  return d.is_cuda() ? cuda::grouped_gemm_row_align() : cpu::grouped_gemm_row_align();
}

// elementwise.h: the backend of the first operand.
void add_(Tensor& a, const Tensor& b) {
  if (a.device().is_cuda()) return cuda::add_(a, b);
  cpu::add_(a, b);
}
void add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.device().is_cuda()) return cuda::add(a, b, out);
  cpu::add(a, b, out);
}
void scale_(Tensor& a, double s) {
  if (a.device().is_cuda()) return cuda::scale_(a, s);
  cpu::scale_(a, s);
}
void fill_(Tensor& a, double v) {
  if (a.device().is_cuda()) return cuda::fill_(a, v);
  cpu::fill_(a, v);
}
double sum(const Tensor& a) {
  return a.device().is_cuda() ? cuda::sum(a) : cpu::sum(a);
}
double dot(const Tensor& a, const Tensor& b) {
  return a.device().is_cuda() ? cuda::dot(a, b) : cpu::dot(a, b);
}
double sum_squares(const Tensor& a) {
  if (a.dtype() == DType::BF16) return sum_squares(a.to(DType::F32));  // a weight stored in bf16
  return a.device().is_cuda() ? cuda::sum_squares(a) : cpu::sum_squares(a);
}
int64_t count_zeros(const Tensor& a) {
  return a.device().is_cuda() ? cuda::count_zeros(a) : cpu::count_zeros(a);
}
// The segments and shapes are checked here, for both backends.
namespace {
void check_segments(const RowSegments& seg, int64_t rows) {
  MOE_ASSERT(seg.begin.size() == seg.count.size());
  for (size_t e = 0; e < seg.begin.size(); e++)
    MOE_ASSERT_MSG(seg.begin[e] >= 0 && seg.count[e] >= 0 && seg.begin[e] + seg.count[e] <= rows,
                   "segment {}: rows [{}, {}) of {}", e, seg.begin[e], seg.begin[e] + seg.count[e], rows);
}
}  // namespace

void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN) {
  const int64_t N = y_RN.cols(), E = static_cast<int64_t>(seg.begin.size());
  MOE_ASSERT_MSG(b_EN.numel() == E * N, "bias {} for {} segments of {} columns", b_EN.shape().str(), E, N);
  MOE_ASSERT(!w_R || w_R->numel() == y_RN.rows());
  check_segments(seg, y_RN.rows());
  if (y_RN.device().is_cuda()) return cuda::segment_bias_forward(b_EN, w_R, seg, y_RN);
  cpu::segment_bias_forward(b_EN, w_R, seg, y_RN);
}

void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                           const Tensor* b_EN, Tensor* dw_R) {
  const int64_t N = dy_RN.cols(), E = static_cast<int64_t>(seg.begin.size()), R = dy_RN.rows();
  MOE_ASSERT_MSG(db_EN.numel() == E * N, "bias gradient {} for {} segments of {} columns", db_EN.shape().str(), E, N);
  MOE_ASSERT(!w_R || w_R->numel() == R);
  MOE_ASSERT((b_EN == nullptr) == (dw_R == nullptr));
  MOE_ASSERT(!dw_R || (b_EN->numel() == E * N && dw_R->numel() == R));
  check_segments(seg, R);
  if (dy_RN.device().is_cuda()) return cuda::segment_bias_backward(dy_RN, w_R, seg, db_EN, b_EN, dw_R);
  cpu::segment_bias_backward(dy_RN, w_R, seg, db_EN, b_EN, dw_R);
}

void copy_cols(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols, int64_t dst_col,
               int64_t rows, int64_t cols) {
  MOE_ASSERT_MSG(src.dtype() == dst.dtype() && src.device() == dst.device(), "column copy {} on {} into {} on {}",
                 dtype_name(src.dtype()), src.device().str(), dtype_name(dst.dtype()), dst.device().str());
  MOE_ASSERT_MSG(src.numel() == rows * src_cols && dst.numel() == rows * dst_cols && src_col >= 0 && dst_col >= 0 &&
                     cols >= 0 && src_col + cols <= src_cols && dst_col + cols <= dst_cols,
                 "columns [{}, +{}) of {} x {} into columns [{}, +{}) of {} x {}", src_col, cols, rows, src_cols,
                 dst_col, cols, rows, dst_cols);
  if (dst.device().is_cuda()) return cuda::copy_cols(src, src_cols, src_col, dst, dst_cols, dst_col, rows, cols);
  cpu::copy_cols(src, src_cols, src_col, dst, dst_cols, dst_col, rows, cols);
}

// One segment of every row.
void add_row_bias_(Tensor& y_TN, const Tensor& b_N) {
  const int64_t begin = 0, rows = y_TN.rows();
  segment_bias_forward(b_N, nullptr, {{&begin, 1}, {&rows, 1}}, y_TN);
}
void accumulate_col_sums(const Tensor& dy_TN, Tensor& db_N) {
  const int64_t begin = 0, rows = dy_TN.rows();
  segment_bias_backward(dy_TN, nullptr, {{&begin, 1}, {&rows, 1}}, db_N);
}

// rmsnorm.h, layernorm.h: the backend of the input rows; each call is one `norm` timer scope (level 2).
void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  if (x_TH.device().is_cuda()) return cuda::rmsnorm_forward(x_TH, w_H, eps, y_TH, rstd_T);
  cpu::rmsnorm_forward(x_TH, w_H, eps, y_TH, rstd_T);
}
void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                         Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  if (x_TH.device().is_cuda()) return cuda::rmsnorm_forward_add(x_TH, res_TH, w_H, eps, y_TH, rstd_T);
  cpu::rmsnorm_forward_add(x_TH, res_TH, w_H, eps, y_TH, rstd_T);
}
void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H, const Tensor* dres_TH) {
  TimerScope timer("norm", 2);
  if (x_TH.device().is_cuda()) return cuda::rmsnorm_backward(dy_TH, x_TH, w_H, rstd_T, dx_TH, dw_H, dres_TH);
  cpu::rmsnorm_backward(dy_TH, x_TH, w_H, rstd_T, dx_TH, dw_H, dres_TH);
}
void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                       Tensor& mean_T, Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  if (x_TH.device().is_cuda()) return cuda::layernorm_forward(x_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
  cpu::layernorm_forward(x_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}
void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                           Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T) {
  TimerScope timer("norm", 2);
  if (x_TH.device().is_cuda()) return cuda::layernorm_forward_add(x_TH, res_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
  cpu::layernorm_forward_add(x_TH, res_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}
void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                        const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH) {
  TimerScope timer("norm", 2);
  if (x_TH.device().is_cuda())
    return cuda::layernorm_backward(dy_TH, x_TH, w_H, mean_T, rstd_T, dx_TH, dw_H, db_H, dres_TH);
  cpu::layernorm_backward(dy_TH, x_TH, w_H, mean_T, rstd_T, dx_TH, dw_H, db_H, dres_TH);
}

// rope.h: the backend of the rows; one `rope` timer scope (level 2) per call.
void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND) {
  TimerScope timer("rope", 2);
  if (x_SBND.device().is_cuda()) return cuda::rope_forward_at(x_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, y_SBND);
  cpu::rope_forward_at(x_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, y_SBND);
}
void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND) {
  TimerScope timer("rope", 2);
  if (dy_SBND.device().is_cuda())
    return cuda::rope_backward_at(dy_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, dx_SBND);
  cpu::rope_backward_at(dy_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, dx_SBND);
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
  if (x.device().is_cuda()) return cuda::activation_forward(act, x, probs_T, y_TF);
  cpu::activation_forward(act, x, probs_T, y_TF);
}
void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                         Tensor* dprobs_T) {
  TimerScope timer("activation", 2);
  if (x.device().is_cuda()) return cuda::activation_backward(act, dy_TF, x, probs_T, dx, dprobs_T);
  cpu::activation_backward(act, dy_TF, x, probs_T, dx, dprobs_T);
}

// embedding.h: the backend of the table (ids may be read from either side); one `embedding` timer scope (level 2).
void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start,
                       int64_t vocab_total) {
  TimerScope timer("embedding", 2);
  if (w_VH.device().is_cuda()) return cuda::embedding_forward(ids_T, w_VH, y_TH, vocab_start, vocab_total);
  cpu::embedding_forward(ids_T, w_VH, y_TH, vocab_start, vocab_total);
}
void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start) {
  TimerScope timer("embedding", 2);
  if (dw_VH.device().is_cuda()) return cuda::embedding_backward(dy_TH, ids_T, dw_VH, vocab_start);
  cpu::embedding_backward(dy_TH, ids_T, dw_VH, vocab_start);
}

// cross_entropy.h: the backend of the logits; one `loss` timer scope (level 2) per call.
void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda()) return cuda::cross_entropy_forward(logits_TV, targets_T, loss_T, lse_T);
  cpu::cross_entropy_forward(logits_TV, targets_T, loss_T, lse_T);
}
void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda())
    return cuda::cross_entropy_forward_vocab_parallel(logits_TV, targets_T, vocab_start, vocab_total, all_reduce,
                                                      loss_T, lse_T);
  cpu::cross_entropy_forward_vocab_parallel(logits_TV, targets_T, vocab_start, vocab_total, all_reduce, loss_T, lse_T);
}
void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda())
    return cuda::cross_entropy_backward(dloss_T, logits_TV, targets_T, lse_T, dlogits_TV, vocab_start);
  cpu::cross_entropy_backward(dloss_T, logits_TV, targets_T, lse_T, dlogits_TV, vocab_start);
}
void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                                    Tensor& lse_T) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda())
    return cuda::cross_entropy_forward_backward(logits_TV, targets_T, dloss_T, loss_T, lse_T);
  cpu::cross_entropy_forward_backward(logits_TV, targets_T, dloss_T, loss_T, lse_T);
}

// adamw.h: the backend of the (first) parameter.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step) {
  if (param.device().is_cuda()) return cuda::adamw_step(param, grad, m, v, hp, step);
  cpu::adamw_step(param, grad, m, v, hp, step);
}
void adamw_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step) {
  if (!tensors.empty() && tensors.front().param.device().is_cuda()) return cuda::adamw_step_multi(tensors, hp, step);
  cpu::adamw_step_multi(tensors, hp, step);
}
// sgd.h
void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp) {
  if (param.device().is_cuda()) return cuda::sgd_step(param, grad, buf, hp);
  cpu::sgd_step(param, grad, buf, hp);
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
  if (x_SBC.device().is_cuda()) return cuda::dropout_forward(x_SBC, m, sample_B, seq_offset, y_SBC);
  cpu::dropout_forward(x_SBC, m, sample_B, seq_offset, y_SBC);
}
// dx = dy ⊙ z: the forward on the gradient, its mask regenerated.
void dropout_backward(const Tensor& dy_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                      int64_t seq_offset, Tensor& dx_SBC) {
  dropout_forward(dy_SBC, m, sample_B, seq_offset, dx_SBC);
}

// attention.h: the backend of the queries (of o for the merge).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout) {
  attention_on(q.device()).forward(q, k, v, scale, o, lse, dropout);
}
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout) {
  attention_on(q.device()).backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
}
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim) {
  attention_on(q.device()).forward_bf16(q, k, v, scale, o, lse, dropout, rope, value_dim);
}
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim) {
  attention_on(q.device()).backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, rope, value_dim);
}
void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                             Tensor& o, Tensor& lse, const AttentionDropout* dropout, bool round_bf16) {
  attention_on(q.device()).block_forward(q, k, v, q0, k0, scale, o, lse, dropout, round_bf16);
}
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part) {
  attention_on(o.device()).merge(o, lse, o_part, lse_part);
}
void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk,
                              Tensor& dv, const AttentionDropout* dropout, bool round_bf16) {
  attention_on(q.device()).block_backward(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dropout, round_bf16);
}

// position_rows.h, mla_blocks.h, shared_gate.h: the backend of the rows they write into or read.
void position_add_rows(Tensor& h_nBH, const Tensor& table_nH) {
  if (h_nBH.device().is_cuda()) return cuda::position_add_rows(h_nBH, table_nH);
  cpu::position_add_rows(h_nBH, table_nH);
}
void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH) {
  if (dh_nBH.device().is_cuda()) return cuda::position_sum_rows(dh_nBH, grad_nH);
  cpu::position_sum_rows(dh_nBH, grad_nH);
}
void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows) {
  if (src.device().is_cuda()) return cuda::mla_move_block(src, Ns, Ws, s0, dst, Nd, Wd, d0, w, rows);
  cpu::mla_move_block(src, Ns, Ws, s0, dst, Nd, Wd, d0, w, rows);
}
void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH) {
  if (m_TH.device().is_cuda()) return cuda::shared_gate_forward(gate_T, m_TH, y_TH);
  cpu::shared_gate_forward(gate_T, m_TH, y_TH);
}
void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T) {
  if (dy_TH.device().is_cuda()) return cuda::shared_gate_backward(dy_TH, gate_T, m_TH, dm_TH, dz_T);
  cpu::shared_gate_backward(dy_TH, gate_T, m_TH, dm_TH, dz_T);
}

}  // namespace moecore::kernels
