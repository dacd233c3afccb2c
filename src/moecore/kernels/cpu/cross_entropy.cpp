// Fused cross-entropy (see cross_entropy.h). ∂loss_t/∂logit_tv = softmax_tv − [v = target_t].
#include "moecore/kernels/cpu/cross_entropy.h"

#include <cmath>
#include <limits>
#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/cpu/vec_math.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels {

namespace {
inline int64_t target_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::I32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
}

template <typename T>
MOE_TARGET_CLONES void lse_rows(const T* logits, T* lse, int64_t rows, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    const T* l = logits + t * V;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t v = 0; v < V; v++) s += vexp(l[v] - mx);
    lse[t] = mx + std::log(s);
  }
}

template <typename T>
MOE_TARGET_CLONES void grad_row(T g, const T* l, T m, T* d, int64_t V) {
#pragma omp simd
  for (int64_t v = 0; v < V; v++) d[v] = vexp(l[v] - m) * g;
}

template <typename T>
void grad_rows(const T* dloss, const T* logits, const T* lse, T* dl, int64_t rows, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; t++) grad_row<T>(dloss[t], logits + t * V, lse[t], dl + t * V, V);
}
}  // namespace

void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda()) return cuda::cross_entropy_forward(logits_TV, targets_T, loss_T, lse_T);
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(targets_T.numel() == rows && loss_T.numel() == rows && lse_T.numel() == rows);
  for (int64_t t = 0; t < rows; t++) {
    const int64_t y = target_at(targets_T, t);
    MOE_CHECK(y >= 0 && y < V, "label {} at position {} is outside the vocabulary [0, {})", y, t, V);
  }
  MOE_DISPATCH_FLOAT(logits_TV.dtype(), T, {
    const T* l = logits_TV.data<T>();
    T* lse = lse_T.data<T>();
    T* loss = loss_T.data<T>();
    lse_rows<T>(l, lse, rows, V);
    for (int64_t t = 0; t < rows; t++) loss[t] = lse[t] - l[t * V + target_at(targets_T, t)];
  });
}

void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda())
    return cuda::cross_entropy_forward_vocab_parallel(logits_TV, targets_T, vocab_start, vocab_total, all_reduce,
                                                      loss_T, lse_T);
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(targets_T.numel() == rows && loss_T.numel() == rows && lse_T.numel() == rows);
  for (int64_t t = 0; t < rows; t++) {
    const int64_t y = target_at(targets_T, t);
    MOE_CHECK(y >= 0 && y < vocab_total, "label {} at position {} is outside the vocabulary [0, {})", y, t,
              vocab_total);
  }
  MOE_DISPATCH_FLOAT(logits_TV.dtype(), T, {
    const T* l = logits_TV.data<T>();
    Tensor mx = Tensor::empty({rows}, logits_TV.dtype());
    T* m = mx.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < rows; t++) {
      T v = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < V; j++) v = l[t * V + j] > v ? l[t * V + j] : v;
      m[t] = v;
    }
    all_reduce(mx, true);
    Tensor sums = Tensor::empty({2 * rows}, logits_TV.dtype());  // [Σ exp(l − max) | target logit or 0]
    T* se = sums.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < rows; t++) {
      T s = 0;
      for (int64_t j = 0; j < V; j++) s += vexp(l[t * V + j] - m[t]);
      se[t] = s;
      const int64_t c = target_at(targets_T, t) - vocab_start;
      se[rows + t] = c >= 0 && c < V ? l[t * V + c] : T(0);
    }
    all_reduce(sums, false);
    T* lse = lse_T.data<T>();
    T* loss = loss_T.data<T>();
    for (int64_t t = 0; t < rows; t++) {
      lse[t] = m[t] + std::log(se[t]);
      loss[t] = lse[t] - se[rows + t];
    }
  });
}

void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start) {
  TimerScope timer("loss", 2);
  if (logits_TV.device().is_cuda())
    return cuda::cross_entropy_backward(dloss_T, logits_TV, targets_T, lse_T, dlogits_TV, vocab_start);
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(dlogits_TV.shape() == logits_TV.shape() && dloss_T.numel() == rows);
  if (dlogits_TV.dtype() == DType::BF16 && logits_TV.dtype() == DType::F32) {
    // Each row in f32 (an L2-sized scratch row), then rounded as it is stored: the bits of the f32 gradient cast
    // to bf16 afterwards, without its [T, V] f32 pass and cast pass.
    const float* g = dloss_T.data<float>();
    const float* l = logits_TV.data<float>();
    const float* lse = lse_T.data<float>();
    bf16* d = dlogits_TV.data<bf16>();
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(V));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < rows; t++) {
        grad_row<float>(g[t], l + t * V, lse[t], row.data(), V);
        const int64_t c = target_at(targets_T, t) - vocab_start;
        if (c >= 0 && c < V) row[static_cast<size_t>(c)] -= g[t];
        uint16_t* out = reinterpret_cast<uint16_t*>(d + t * V);
        const float* r = row.data();
#pragma omp simd
        for (int64_t v = 0; v < V; v++) out[v] = float_to_bf16(r[v]).bits;
      }
    }
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

}  // namespace moecore::kernels
