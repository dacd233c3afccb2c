// Tensor-level CUDA entry points (see kernels.h): shape and device checks, then the launchers of launch.h on the
// current stream. Shapes are asserted exactly as the CPU kernels assert them.
#include "moecore/kernels/cuda/kernels.h"

#include <algorithm>
#include <cmath>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/runtime.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"
#include "moecore/kernels/cuda/multi_tensor_ops.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using moecore::device::current_stream;

namespace {
using detail::check_launch;
using detail::f32;
using detail::ids64;

// The reductions leave one f64 on the GPU; copy it back.
double reduce(int kind, const Tensor& a, const Tensor* b) {
  Tensor out = Tensor::empty({1}, DType::F64, a.device());
  launch::reduce_sum(kind, f32(a, "a"), b ? f32(*b, "b") : nullptr, a.numel(), out.device_data<double>(),
                     current_stream());
  check_launch("reduce_sum");
  double r = 0;
  moecore::device::copy_bytes(&r, Device::cpu(), out.raw(), a.device(), sizeof r);
  return r;
}
// The partial sums of a two-stage column reduction (launch_col_reduce.h), from the caching allocator on the current
// stream: freed when the caller returns, reused only by later work on that stream.
Tensor col_scratch(int64_t rows, int64_t N, int outputs, Device d) {
  return Tensor::empty({std::max<int64_t>(launch::col_reduce_scratch_floats(rows, N, outputs), 1)}, DType::F32, d);
}
}  // namespace

void add_(Tensor& a, const Tensor& b) {
  add(a, b, a);
}
void add(const Tensor& a, const Tensor& b, Tensor& out) {
  MOE_ASSERT(a.numel() == b.numel() && a.numel() == out.numel());
  launch::add(f32(a, "a"), f32(b, "b"), f32(out, "out"), a.numel(), current_stream());
  check_launch("add");
}
void scale_(Tensor& a, double s) {
  launch::scale(f32(a, "a"), static_cast<float>(s), a.numel(), current_stream());
  check_launch("scale");
}
void fill_(Tensor& a, double v) {
  launch::fill(f32(a, "a"), static_cast<float>(v), a.numel(), current_stream());
  check_launch("fill");
}
double sum(const Tensor& a) {
  return reduce(1, a, nullptr);
}
double dot(const Tensor& a, const Tensor& b) {
  MOE_ASSERT(a.numel() == b.numel());
  return reduce(2, a, &b);
}
double sum_squares(const Tensor& a) {
  return reduce(0, a, nullptr);
}
int64_t count_zeros(const Tensor& a) {
  Tensor out = Tensor::empty({1}, DType::I64, a.device());
  launch::count_zeros(f32(a, "a"), a.numel(), out.device_data<int64_t>(), current_stream());
  check_launch("count_zeros");
  int64_t r = 0;
  moecore::device::copy_bytes(&r, Device::cpu(), out.raw(), a.device(), sizeof r);
  return r;
}

namespace {
// The norm kernels proper: y_TH of x's dtype (f32).
void rmsnorm_rows(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kNorm);
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT(y_TH.shape() == x_TH.shape() && rstd_T.numel() == rows);
  launch::rmsnorm_forward(f32(x_TH, "x"), f32(w_H, "w"), f32(y_TH, "y"), f32(rstd_T, "rstd"), rows, H,
                          static_cast<float>(eps), current_stream());
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward_rows(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T,
                           Tensor& dx_TH, Tensor& dw_H) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kNorm);
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT(dy_TH.shape() == x_TH.shape() && dx_TH.shape() == x_TH.shape());
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT_SHAPE(dw_H, {H});
  MOE_ASSERT(rstd_T.numel() == rows);
  Tensor scratch = col_scratch(rows, H, 1, x_TH.device());
  launch::rmsnorm_backward(f32(dy_TH, "dy"), f32(x_TH, "x"), f32(w_H, "w"), f32(rstd_T, "rstd"), f32(dx_TH, "dx"),
                           f32(dw_H, "dw"), scratch.device_data<float>(), rows, H, current_stream());
  check_launch("rmsnorm_backward");
}

void layernorm_rows(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH, Tensor& mean_T,
                    Tensor& rstd_T) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kNorm);
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT_SHAPE(b_H, {H});
  MOE_ASSERT(y_TH.shape() == x_TH.shape() && mean_T.numel() == rows && rstd_T.numel() == rows);
  launch::layernorm_forward(f32(x_TH, "x"), f32(w_H, "w"), f32(b_H, "b"), f32(y_TH, "y"), f32(mean_T, "mean"),
                            f32(rstd_T, "rstd"), rows, H, static_cast<float>(eps), current_stream());
  check_launch("layernorm_forward");
}

void layernorm_backward_rows(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                             const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kNorm);
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT(dy_TH.shape() == x_TH.shape() && dx_TH.shape() == x_TH.shape());
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT_SHAPE(dw_H, {H});
  MOE_ASSERT_SHAPE(db_H, {H});
  MOE_ASSERT(mean_T.numel() == rows && rstd_T.numel() == rows);
  Tensor scratch = col_scratch(rows, H, 2, x_TH.device());
  launch::layernorm_backward(f32(dy_TH, "dy"), f32(x_TH, "x"), f32(w_H, "w"), f32(mean_T, "mean"), f32(rstd_T, "rstd"),
                             f32(dx_TH, "dx"), f32(dw_H, "dw"), f32(db_H, "db"), scratch.device_data<float>(), rows, H,
                             current_stream());
  check_launch("layernorm_backward");
}

void check_norm_output(const Tensor& x_TH, const Tensor& y_TH) {
  MOE_ASSERT(y_TH.shape() == x_TH.shape());
  MOE_ASSERT(y_TH.dtype() == x_TH.dtype() || (y_TH.dtype() == DType::BF16 && x_TH.dtype() == DType::F32));
}
void check_residual(const Tensor& x_TH, const Tensor* res_TH) {
  MOE_ASSERT(!res_TH || (res_TH->numel() == x_TH.numel() && res_TH->dtype() == x_TH.dtype()));
}
}  // namespace

// A bf16 y_TH (an f32 input's rows rounded as they are stored, rmsnorm.h): the f32 rows, then their cast.
void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T) {
  check_norm_output(x_TH, y_TH);
  if (y_TH.dtype() == x_TH.dtype()) return rmsnorm_rows(x_TH, w_H, eps, y_TH, rstd_T);
  Tensor y = Tensor::empty(x_TH.shape(), x_TH.dtype(), x_TH.device());
  rmsnorm_rows(x_TH, w_H, eps, y, rstd_T);
  y_TH.copy_from(y);
}

// The residual add, then the norm (and dres added after the backward kernel): unfused.
void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                         Tensor& rstd_T) {
  check_residual(x_TH, &res_TH);
  add_(x_TH, res_TH);
  rmsnorm_forward(x_TH, w_H, eps, y_TH, rstd_T);
}

// A bf16 x_TH (an input kept rounded for backward, rmsnorm.h): widened into f32 rows first.
void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H, const Tensor* dres_TH) {
  check_residual(dx_TH, dres_TH);
  rmsnorm_backward_rows(dy_TH, x_TH.as_dtype(dy_TH.dtype()), w_H, rstd_T, dx_TH, dw_H);
  if (dres_TH) add_(dx_TH, *dres_TH);
}

void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                       Tensor& mean_T, Tensor& rstd_T) {
  check_norm_output(x_TH, y_TH);
  if (y_TH.dtype() == x_TH.dtype()) return layernorm_rows(x_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
  Tensor y = Tensor::empty(x_TH.shape(), x_TH.dtype(), x_TH.device());
  layernorm_rows(x_TH, w_H, b_H, eps, y, mean_T, rstd_T);
  y_TH.copy_from(y);
}

void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                           Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T) {
  check_residual(x_TH, &res_TH);
  add_(x_TH, res_TH);
  layernorm_forward(x_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}

void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                        const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH) {
  check_residual(dx_TH, dres_TH);
  layernorm_backward_rows(dy_TH, x_TH.as_dtype(dy_TH.dtype()), w_H, mean_T, rstd_T, dx_TH, dw_H, db_H);
  if (dres_TH) add_(dx_TH, *dres_TH);
}

// Shapes and segments are checked by the device-neutral entry points (kernels/dispatch.cpp).
void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN) {
  const int64_t N = y_RN.cols(), E = static_cast<int64_t>(seg.begin.size());
  MOE_ASSERT_MSG(y_RN.device().is_cuda() && (y_RN.dtype() == DType::F32 || y_RN.dtype() == DType::BF16),
                 "the bias is added to f32 or bf16 rows on the GPU, got {} on {}", dtype_name(y_RN.dtype()),
                 y_RN.device().str());
  const bool y16 = y_RN.dtype() == DType::BF16;
  char* y = static_cast<char*>(y_RN.raw());
  const size_t row_bytes = static_cast<size_t>(N) * dtype_size(y_RN.dtype());
  const float* b = f32(b_EN, "b");
  const float* w = w_R ? f32(*w_R, "w") : nullptr;
  for (int64_t e = 0; e < E; e++) {
    const int64_t r0 = seg.begin[e], n = seg.count[e];
    if (n > 0)
      launch::add_row_bias(y + static_cast<size_t>(r0) * row_bytes, y16, b + e * N, w ? w + r0 : nullptr, n, N,
                           current_stream());
  }
  check_launch("add_row_bias");
}

void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                           const Tensor* b_EN, Tensor* dw_R) {
  const int64_t N = dy_RN.cols(), E = static_cast<int64_t>(seg.begin.size());
  MOE_ASSERT_MSG(dy_RN.device().is_cuda() && (dy_RN.dtype() == DType::F32 || dy_RN.dtype() == DType::BF16),
                 "the bias gradient reads f32 or bf16 rows on the GPU, got {} on {}", dtype_name(dy_RN.dtype()),
                 dy_RN.device().str());
  const bool dy16 = dy_RN.dtype() == DType::BF16;
  const char* dy = static_cast<const char*>(dy_RN.raw());
  const size_t row_bytes = static_cast<size_t>(N) * dtype_size(dy_RN.dtype());
  float* db = f32(db_EN, "db");
  const float* w = w_R ? f32(*w_R, "w") : nullptr;
  const float* b = b_EN ? f32(*b_EN, "b") : nullptr;
  float* dw = dw_R ? f32(*dw_R, "dw") : nullptr;
  int64_t most = 0;
  for (int64_t c : seg.count) most = std::max(most, c);
  // One scratch for every segment: their reductions run one after another on this stream.
  Tensor scratch = col_scratch(most, N, 1, dy_RN.device());
  for (int64_t e = 0; e < E; e++) {
    const int64_t r0 = seg.begin[e], n = seg.count[e];
    if (n == 0) continue;
    const void* dy_e = dy + static_cast<size_t>(r0) * row_bytes;
    launch::accumulate_col_sums(dy_e, dy16, w ? w + r0 : nullptr, db + e * N, scratch.device_data<float>(), n, N,
                                current_stream());
    if (dw) launch::add_row_dots(dy_e, dy16, b + e * N, dw + r0, n, N, current_stream());
  }
  check_launch("segment_bias_backward");
}

namespace {
void rope(const Tensor& x, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim, RopePairs pairs,
          Tensor& y, float sign) {
  MOE_ASSERT_MSG(x.ndim() == 4, "rope input must be [S, B, N, D], got {}", x.shape().str());
  MOE_ASSERT(y.shape() == x.shape());
  const int64_t S = x.dim(0), BN = x.dim(1) * x.dim(2), D = x.dim(3), h = rot_dim / 2;
  MOE_ASSERT_MSG(offset >= 0 && offset + rot_dim <= D && rot_dim % 2 == 0, "rotary dims [{}, {}) vs head dim {}",
                 offset, offset + rot_dim, D);
  MOE_ASSERT(cos_SR.dim(0) >= S && cos_SR.dim(1) == h);
  launch::rope(f32(x, "x"), f32(cos_SR, "cos"), f32(sin_SR, "sin"), f32(y, "y"), S, BN, D, offset, rot_dim,
               pairs == RopePairs::Interleaved, sign, current_stream());
  check_launch("rope");
}
}  // namespace

void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND) {
  rope(x_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, y_SBND, 1.0f);
}
void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND) {
  rope(dy_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, dx_SBND, -1.0f);
}

namespace {
// x, dy: f32 or bf16 on the GPU, read by the activation kernels as they are (a bf16 fc1 output kept rounded for
// backward, or a bf16 output gradient written so by the fc2 data-gradient GEMM), widened in registers.
bool act_operand_bf16(const Tensor& t, const char* name) {
  MOE_ASSERT_MSG(t.device().is_cuda() && (t.dtype() == DType::F32 || t.dtype() == DType::BF16),
                 "activation {} must be f32 or bf16 on the GPU, got {} on {}", name, dtype_name(t.dtype()),
                 t.device().str());
  return t.dtype() == DType::BF16;
}
}  // namespace

void activation_forward(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kActivation);
  const int64_t rows = x.rows(), F = y_TF.cols();
  MOE_ASSERT_MSG(x.cols() == (is_gated(act) ? 2 * F : F) && y_TF.rows() == rows, "{} input {} output {}",
                 activation_name(act), x.shape().str(), y_TF.shape().str());
  MOE_ASSERT(!probs_T || probs_T->numel() == rows);
  MOE_ASSERT(y_TF.dtype() == DType::F32 || y_TF.dtype() == DType::BF16);
  MOE_ASSERT(y_TF.device().is_cuda());
  const bool x16 = act_operand_bf16(x, "input");
  launch::activation_forward(static_cast<int>(act), x.raw(), x16, probs_T ? f32(*probs_T, "probs") : nullptr,
                             y_TF.raw(), y_TF.dtype() == DType::BF16, rows, F, current_stream());
  check_launch("activation_forward");
}

void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                         Tensor* dprobs_T) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kActivation);
  const int64_t rows = x.rows(), F = dy_TF.cols();
  MOE_ASSERT(dx.shape() == x.shape() && dy_TF.rows() == rows);
  MOE_ASSERT(x.cols() == (is_gated(act) ? 2 * F : F));
  MOE_ASSERT(!probs_T || probs_T->numel() == rows);
  MOE_ASSERT(!dprobs_T || dprobs_T->numel() == rows);
  MOE_ASSERT((dx.dtype() == DType::F32 || dx.dtype() == DType::BF16) && dx.device().is_cuda());
  const bool dy16 = act_operand_bf16(dy_TF, "output gradient"), x16 = act_operand_bf16(x, "input");
  launch::activation_backward(static_cast<int>(act), dy_TF.raw(), dy16, x.raw(), x16,
                              probs_T ? f32(*probs_T, "probs") : nullptr, dx.raw(), dx.dtype() == DType::BF16,
                              dprobs_T ? f32(*dprobs_T, "dprobs") : nullptr, rows, F, current_stream());
  check_launch("activation_backward");
}

void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start,
                       int64_t vocab_total) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kLoss);
  const int64_t T_ = ids_T.numel(), VL = w_VH.dim(0), H = w_VH.dim(1);
  const int64_t V = vocab_total > 0 ? vocab_total : VL;
  MOE_ASSERT(y_TH.rows() == T_ && y_TH.cols() == H && y_TH.dtype() == w_VH.dtype());
  MOE_ASSERT(w_VH.device().is_cuda() && y_TH.device().is_cuda());
  // Checked without a read-back: the first id outside is recorded on the device and raised when the trainer
  // logs (kernels/id_checks.h); the kernel writes zero rows for it meanwhile.
  record_bad_ids(ids_T, V, 0);
  launch::embedding_forward(ids_T.raw(), ids64(ids_T), w_VH.raw(), y_TH.raw(), T_, H, VL, vocab_start,
                            static_cast<int>(dtype_size(w_VH.dtype())), current_stream());
  check_launch("embedding_forward");
}

void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kLoss);
  const int64_t T_ = ids_T.numel(), H = dw_VH.dim(1), VL = dw_VH.dim(0);
  MOE_ASSERT(dy_TH.rows() == T_ && dy_TH.cols() == H && dy_TH.dtype() == dw_VH.dtype());
  // The tokens' order by row and CUB's sort storage (embedding_bwd.cu), from the caching allocator.
  const size_t sort_bytes = launch::embedding_sort_scratch_bytes(T_, VL);
  Tensor order = Tensor::empty({std::max<int64_t>(4 * T_, 1)}, DType::I32, dw_VH.device());
  Tensor sort_tmp = Tensor::empty({static_cast<int64_t>(sort_bytes / 8 + 1)}, DType::I64, dw_VH.device());
  launch::embedding_backward(f32(dy_TH, "dy"), ids_T.raw(), ids64(ids_T), f32(dw_VH, "dw"), T_, H, VL, vocab_start,
                             order.device_data<int32_t>(), sort_tmp.raw(), sort_bytes, current_stream());
  check_launch("embedding_backward");
}

// This backend's tables (kernels/backends.h).
const ElementwiseKernels kElementwiseKernels{
    add_,     add, scale_, fill_, sum, dot, sum_squares, count_zeros, segment_bias_forward, segment_bias_backward,
    copy_cols};
const NormKernels kNormKernels{rmsnorm_forward,   rmsnorm_forward_add,   rmsnorm_backward,
                               layernorm_forward, layernorm_forward_add, layernorm_backward};
const RopeKernels kRopeKernels{rope_forward_at, rope_backward_at};
const ActivationKernels kActivationKernels{activation_forward, activation_backward};
const EmbeddingKernels kEmbeddingKernels{embedding_forward, embedding_backward};

}  // namespace moecore::kernels::cuda
