// Fused cross-entropy (see cross_entropy.h). ∂loss_t/∂logit_tv = softmax_tv − [v = target_t].
#include "moecore/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels::cpu {

namespace {
inline int64_t target_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::I32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
}

// Every label a row of the vocabulary [0, vocab), or a clear error naming the first that is not.
void check_labels(const Tensor& targets_T, int64_t rows, int64_t vocab) {
  for (int64_t t = 0; t < rows; t++) {
    const int64_t y = target_at(targets_T, t);
    MOE_CHECK(y >= 0 && y < vocab, "label {} at position {} is outside the vocabulary [0, {})", y, t, vocab);
  }
}

// Logits are read in their storage dtype L and computed in C: f64 for f64, f32 for f32 and bf16 (Megatron's
// cross-entropy upcasts its bf16 logits to f32), f32 for f16 likewise (--fp16).
template <typename L>
using Compute = std::conditional_t<std::is_same_v<L, double>, double, float>;
template <typename L>
constexpr bool kHalf = std::is_same_v<L, bf16> || std::is_same_v<L, f16>;
inline float widen(bf16 x) {
  return bf16_to_float(x);
}
inline float widen(f16 x) {
  return f16_to_float(x);
}
inline float widen(float x) {
  return x;
}
inline double widen(double x) {
  return x;
}

template <typename C>
MOE_ALWAYS_INLINE C row_max_body(const C* l, int64_t V) {
  C mx = -std::numeric_limits<C>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
  return mx;
}
template <typename C>
C row_max(const C* l, int64_t V) {
  return MOE_CPU_CLONES(row_max_body<C>(l, V));
}

template <typename C>
MOE_ALWAYS_INLINE C lse_row_body(const C* l, C mx, int64_t V) {
  C s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; v++) s += vexp(l[v] - mx);
  return mx + std::log(s);
}
template <typename C>
C lse_row(const C* l, C mx, int64_t V) {
  return MOE_CPU_CLONES(lse_row_body<C>(l, mx, V));
}

// A bf16 (f16) row widened into f32, and its maximum.
template <typename L>
MOE_ALWAYS_INLINE float widen_row_max_body(const L* l, float* out, int64_t V) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; v++) {
    out[v] = widen(l[v]);
    mx = out[v] > mx ? out[v] : mx;
  }
  return mx;
}
template <typename L>
float widen_row_max(const L* l, float* out, int64_t V) {
  return MOE_CPU_CLONES(widen_row_max_body<L>(l, out, V));
}

// bf16 rows are widened into an L2-sized f32 row first (finding the maximum as they are): the sum of exponentials
// then runs at the f32 loop's rate, where widening inside it made the forward half as slow again.
template <typename L, typename C = Compute<L>>
void lse_rows(const L* logits, C* lse, int64_t rows, int64_t V) {
#pragma omp parallel
  {
    std::vector<float> row(kHalf<L> ? static_cast<size_t>(V) : 0);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; t++) {
      if constexpr (kHalf<L>) {
        const float mx = widen_row_max(logits + t * V, row.data(), V);
        lse[t] = lse_row<C>(row.data(), mx, V);
      } else {
        lse[t] = lse_row<C>(logits + t * V, row_max<C>(logits + t * V, V), V);
      }
    }
  }
}

template <typename L, typename C>
MOE_ALWAYS_INLINE void grad_row_body(C g, const L* l, C m, C* d, int64_t V) {
#pragma omp simd
  for (int64_t v = 0; v < V; v++) d[v] = vexp(widen(l[v]) - m) * g;
}
template <typename L, typename C = Compute<L>>
void grad_row(C g, const L* l, C m, C* d, int64_t V) {
  MOE_CPU_CLONES(grad_row_body<L, C>(g, l, m, d, V));
}

template <typename T>
void grad_rows(const T* dloss, const T* logits, const T* lse, T* dl, int64_t rows, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; t++) grad_row<T>(dloss[t], logits + t * V, lse[t], dl + t * V, V);
}

// A bf16 gradient from f32 or bf16 logits: each row in f32 pieces of kGradPiece (an L1-sized scratch), then rounded
// as they are stored: the bits of the f32 gradient cast to bf16 afterwards, without its [T, V] f32 pass and cast pass.
// A piece is complete before it is stored, so the gradient may overwrite the logits.
constexpr int64_t kGradPiece = 1024;
template <typename L, typename D>
void bf16_grad_rows(const float* g, const L* l, const float* lse, const Tensor& targets_T, int64_t vocab_start, D* d,
                    int64_t rows, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    alignas(64) float piece[kGradPiece];
    const int64_t c = target_at(targets_T, t) - vocab_start;
    for (int64_t v0 = 0; v0 < V; v0 += kGradPiece) {
      const int64_t n = std::min(kGradPiece, V - v0);
      grad_row<L>(g[t], l + t * V + v0, lse[t], piece, n);
      if (c >= v0 && c < v0 + n) piece[c - v0] -= g[t];
      D* out = d + t * V + v0;
#pragma omp simd
      for (int64_t v = 0; v < n; v++) store_as(out + v, piece[v]);
    }
  }
}

// A row's exponentials in place, r ← exp(r − mx), and their sum (the sum of lse_row, in the same order).
MOE_ALWAYS_INLINE float exp_row_sum_body(float* r, float mx, int64_t V) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; v++) {
    r[v] = vexp(r[v] - mx);
    s += r[v];
  }
  return s;
}
float exp_row_sum(float* r, float mx, int64_t V) {
  return MOE_CPU_CLONES(exp_row_sum_body(r, mx, V));
}

// out ← r·mul in the logits' storage type L (bf16 rounded to nearest even); out may be r itself.
template <typename L>
MOE_ALWAYS_INLINE void scaled_row_body(const float* r, float mul, L* out, int64_t V) {
#pragma omp simd
  for (int64_t v = 0; v < V; v++) store_as(out + v, r[v] * mul);
}
template <typename L>
void scaled_row(const float* r, float mul, L* out, int64_t V) {
  MOE_CPU_CLONES(scaled_row_body<L>(r, mul, out, V));
}

// cross_entropy_forward_backward on f32 or bf16 logits, row by row: the row in f32 (bf16 widened into an L2-sized
// row, f32 in place) → e = exp(l − max) and s = Σ e → lse and the loss; then the gradient g·(e/s − [v = target])
// over the logits, from the exponentials already computed (one per element, where forward and backward apart take
// two): e·(g/s), the target's minus g.
template <typename L>
void forward_backward_rows(L* logits, const Tensor& targets_T, const float* g, float* loss, float* lse, int64_t rows,
                           int64_t V) {
#pragma omp parallel
  {
    std::vector<float> row(kHalf<L> ? static_cast<size_t>(V) : 0);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; t++) {
      L* l = logits + t * V;
      float* r = nullptr;
      float mx = 0;
      if constexpr (kHalf<L>) {
        r = row.data();
        mx = widen_row_max(l, r, V);
      } else {
        r = l;
        mx = row_max<float>(l, V);
      }
      const int64_t c = target_at(targets_T, t);
      const float target = r[c];
      const float s = exp_row_sum(r, mx, V);
      lse[t] = mx + std::log(s);
      loss[t] = lse[t] - target;
      const float mul = g[t] / s, ec = r[c];
      scaled_row<L>(r, mul, l, V);
      store_as(l + c, ec * mul - g[t]);
    }
  }
}

// Runs body.template operator()<L>() with L the logits' storage type (f32, f64 or bf16).
template <typename F>
void with_logits_type(DType dt, F&& body) {
  if (dt == DType::BF16) return body.template operator()<bf16>();
  if (dt == DType::F16) return body.template operator()<f16>();
  MOE_DISPATCH_FLOAT(dt, T, { body.template operator()<T>(); });
}

}  // namespace

void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T) {
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(targets_T.numel() == rows && loss_T.numel() == rows && lse_T.numel() == rows);
  MOE_ASSERT(loss_T.dtype() == cross_entropy_stats_dtype(logits_TV.dtype()) && lse_T.dtype() == loss_T.dtype());
  check_labels(targets_T, rows, V);
  with_logits_type(logits_TV.dtype(), [&]<typename L>() {
    using C = Compute<L>;
    const L* l = logits_TV.data<L>();
    C* lse = lse_T.data<C>();
    C* loss = loss_T.data<C>();
    lse_rows<L>(l, lse, rows, V);
    for (int64_t t = 0; t < rows; t++) loss[t] = lse[t] - widen(l[t * V + target_at(targets_T, t)]);
  });
}

void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T) {
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(targets_T.numel() == rows && loss_T.numel() == rows && lse_T.numel() == rows);
  const DType cdt = cross_entropy_stats_dtype(logits_TV.dtype());
  MOE_ASSERT(loss_T.dtype() == cdt && lse_T.dtype() == cdt);
  check_labels(targets_T, rows, vocab_total);
  with_logits_type(logits_TV.dtype(), [&]<typename L>() {
    using C = Compute<L>;
    const L* l = logits_TV.data<L>();
    Tensor mx = Tensor::empty({rows}, cdt);
    C* m = mx.data<C>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; t++) {
      C v = -std::numeric_limits<C>::infinity();
      for (int64_t j = 0; j < V; j++) v = widen(l[t * V + j]) > v ? widen(l[t * V + j]) : v;
      m[t] = v;
    }
    all_reduce(mx, true);
    Tensor sums = Tensor::empty({2 * rows}, cdt);  // [Σ exp(l − max) | target logit or 0]
    C* se = sums.data<C>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; t++) {
      C s = 0;
      for (int64_t j = 0; j < V; j++) s += vexp(widen(l[t * V + j]) - m[t]);
      se[t] = s;
      const int64_t c = target_at(targets_T, t) - vocab_start;
      se[rows + t] = c >= 0 && c < V ? widen(l[t * V + c]) : C(0);
    }
    all_reduce(sums, false);
    C* lse = lse_T.data<C>();
    C* loss = loss_T.data<C>();
    for (int64_t t = 0; t < rows; t++) {
      lse[t] = m[t] + std::log(se[t]);
      loss[t] = lse[t] - se[rows + t];
    }
  });
}

void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                                    Tensor& lse_T) {
  const DType dt = logits_TV.dtype();
  if (dt != DType::F32 && !is_half(dt)) {  // f64: the two calls
    cpu::cross_entropy_forward(logits_TV, targets_T, loss_T, lse_T);
    cpu::cross_entropy_backward(dloss_T, logits_TV, targets_T, lse_T, logits_TV, 0);
    return;
  }
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(targets_T.numel() == rows && loss_T.numel() == rows && lse_T.numel() == rows && dloss_T.numel() == rows);
  MOE_ASSERT(loss_T.dtype() == DType::F32 && lse_T.dtype() == DType::F32 && dloss_T.dtype() == DType::F32);
  check_labels(targets_T, rows, V);
  const float* g = dloss_T.data<float>();
  float *loss = loss_T.data<float>(), *lse = lse_T.data<float>();
  if (dt == DType::BF16)
    forward_backward_rows(logits_TV.data<bf16>(), targets_T, g, loss, lse, rows, V);
  else if (dt == DType::F16)
    forward_backward_rows(logits_TV.data<f16>(), targets_T, g, loss, lse, rows, V);
  else
    forward_backward_rows(logits_TV.data<float>(), targets_T, g, loss, lse, rows, V);
}

void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start) {
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(dlogits_TV.shape() == logits_TV.shape() && dloss_T.numel() == rows);
  if (dlogits_TV.dtype() == DType::BF16) {
    MOE_ASSERT(logits_TV.dtype() == DType::BF16 || logits_TV.dtype() == DType::F32);
    MOE_ASSERT(dloss_T.dtype() == DType::F32 && lse_T.dtype() == DType::F32);
    const float *g = dloss_T.data<float>(), *lse = lse_T.data<float>();
    bf16* d = dlogits_TV.data<bf16>();
    if (logits_TV.dtype() == DType::BF16)
      bf16_grad_rows(g, logits_TV.data<bf16>(), lse, targets_T, vocab_start, d, rows, V);
    else
      bf16_grad_rows(g, logits_TV.data<float>(), lse, targets_T, vocab_start, d, rows, V);
    return;
  }
  if (dlogits_TV.dtype() == DType::F16) {  // --fp16: as bf16's
    MOE_ASSERT(logits_TV.dtype() == DType::F16 || logits_TV.dtype() == DType::F32);
    MOE_ASSERT(dloss_T.dtype() == DType::F32 && lse_T.dtype() == DType::F32);
    const float *g = dloss_T.data<float>(), *lse = lse_T.data<float>();
    f16* d = dlogits_TV.data<f16>();
    if (logits_TV.dtype() == DType::F16)
      bf16_grad_rows(g, logits_TV.data<f16>(), lse, targets_T, vocab_start, d, rows, V);
    else
      bf16_grad_rows(g, logits_TV.data<float>(), lse, targets_T, vocab_start, d, rows, V);
    return;
  }
  MOE_ASSERT(dlogits_TV.dtype() == logits_TV.dtype());
  MOE_DISPATCH_FLOAT(logits_TV.dtype(), T, {
    T* d = dlogits_TV.data<T>();
    const T* g = dloss_T.data<T>();
    grad_rows<T>(g, logits_TV.data<T>(), lse_T.data<T>(), d, rows, V);
    for (int64_t t = 0; t < rows; t++) {
      const int64_t c = target_at(targets_T, t) - vocab_start;
      if (c >= 0 && c < V) d[t * V + c] -= g[t];
    }
  });
}

}  // namespace moecore::kernels::cpu

namespace moecore::kernels {

DType cross_entropy_stats_dtype(DType logits) {
  return is_half(logits) ? DType::F32 : logits;
}

}  // namespace moecore::kernels

namespace moecore::kernels::cpu {

// This backend's table (kernels/backends.h).
const CrossEntropyKernels kCrossEntropyKernels{cross_entropy_forward, cross_entropy_forward_vocab_parallel,
                                               cross_entropy_backward, cross_entropy_forward_backward};

}  // namespace moecore::kernels::cpu
