// AdamW update (see adamw.h).

#include <emmintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

namespace {
// Moments are read and written as f32 (or f64), or stored in bf16 (Megatron's precision-aware optimizer,
// TransformerEngine's FusedAdam with bf16 states): loaded to f32, updated in f32, the update computed from the f32
// values, then rounded to nearest even on store.
template <typename T>
inline T load(T x) {
  return x;
}
inline float load(bf16 x) {
  return bf16_to_float(x);
}
template <typename M, typename T>
inline M store(T x) {
  if constexpr (std::is_same_v<M, bf16>)
    return float_to_bf16(x);
  else
    return x;
}

// dst[0, n) ← src[0, n) in stores that bypass the caches (the lines are not read first): the bf16 copy of the weights,
// which nothing reads before the next forward, long after it would have left the caches.
void stream_copy(uint16_t* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; i++) dst[i] = src[i];
  for (; i + 8 <= n; i += 8)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  for (; i < n; i++) dst[i] = src[i];
}

// One run of elements; vectorized (-fno-math-errno lets sqrt vectorize: the same, correctly rounded bits). With
// P16 the new parameter is also stored rounded in p16 (P16 1: bf16, 2: f16), a piece of kPiece at a time through
// stream_copy.
constexpr int64_t kPiece = 512;
template <typename T, typename M, typename V, int P16>
MOE_ALWAYS_INLINE void update_piece_body(T* p, const T* g, M* m, V* v, uint16_t* p16, int64_t n, T lr, T b1, T b2,
                                         T eps, T wd, T bc1, T bc2, T gs) {
  for (int64_t i = 0; i < n; i++) {
    const T gi = g[i] * gs;
    const T mi = b1 * load(m[i]) + (T(1) - b1) * gi;
    const T vi = b2 * load(v[i]) + (T(1) - b2) * gi * gi;
    m[i] = store<M>(mi);
    v[i] = store<V>(vi);
    const T mhat = mi / bc1;
    const T vhat = vi / bc2;
    const T pi = p[i] * (T(1) - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
    p[i] = pi;
    if constexpr (P16 == 1) p16[i] = float_to_bf16(static_cast<float>(pi)).bits;
    if constexpr (P16 == 2) p16[i] = float_to_f16(static_cast<float>(pi)).bits;
  }
}
template <typename T, typename M, typename V, int P16>
void update_piece(T* p, const T* g, M* m, V* v, uint16_t* p16, int64_t n, T lr, T b1, T b2, T eps, T wd, T bc1, T bc2,
                  T gs) {
  MOE_CPU_CLONES(update_piece_body<T, M, V, P16>(p, g, m, v, p16, n, lr, b1, b2, eps, wd, bc1, bc2, gs));
}

template <typename T, typename M, typename V, int P16>
void update(T* p, const T* g, M* m, V* v, uint16_t* p16, int64_t n, T lr, T b1, T b2, T eps, T wd, T bc1, T bc2, T gs) {
  if constexpr (!P16) {
    update_piece<T, M, V, 0>(p, g, m, v, nullptr, n, lr, b1, b2, eps, wd, bc1, bc2, gs);
  } else {
    alignas(64) uint16_t piece[kPiece];
    for (int64_t i = 0; i < n; i += kPiece) {
      const int64_t k = std::min(kPiece, n - i);
      update_piece<T, M, V, P16>(p + i, g + i, m + i, v + i, piece, k, lr, b1, b2, eps, wd, bc1, bc2, gs);
      stream_copy(p16 + i, piece, k);
    }
    _mm_sfence();  // the streaming stores are weakly ordered: complete before another thread reads the copy
  }
}

constexpr int64_t kSerialElements = 16384;  // below this, one thread
constexpr int64_t kLine = 16;               // elements per thread boundary step (a 64-byte line of f32)

template <typename T, typename M, typename V>
void step_all(std::vector<AdamWTensor>& ts, const AdamWParams& hp, double bc1, double bc2) {
  std::vector<int64_t> start(ts.size() + 1, 0);
  for (size_t k = 0; k < ts.size(); k++) start[k + 1] = start[k] + ts[k].param.numel();
  const int64_t total = start.back();
  const int threads = total > kSerialElements ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lines = (total + kLine - 1) / kLine;
    const int64_t begin = std::min(total, lines * t / nt * kLine), end = std::min(total, lines * (t + 1) / nt * kLine);
    size_t k = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), begin) - start.begin()) - 1;
    for (int64_t at = begin; at < end && k < ts.size(); k++) {
      const int64_t lo = at - start[k], hi = std::min(end, start[k + 1]) - start[k];
      if (hi <= lo) continue;
      AdamWTensor& x = ts[k];
      T* p = x.param.data<T>() + lo;
      const T* g = x.grad.data<T>() + lo;
      M* m = x.m.data<M>() + lo;
      V* v = x.v.data<V>() + lo;
      const T lr = T(hp.lr), b1 = T(hp.beta1), b2 = T(hp.beta2), eps = T(hp.eps), wd = T(x.weight_decay);
      if (x.param_bf16.defined() && x.param_bf16.dtype() == DType::F16)
        update<T, M, V, 2>(p, g, m, v, reinterpret_cast<uint16_t*>(x.param_bf16.data<f16>()) + lo, hi - lo, lr, b1, b2,
                           eps, wd, T(bc1), T(bc2), T(hp.grad_scale));
      else if (x.param_bf16.defined())
        update<T, M, V, 1>(p, g, m, v, reinterpret_cast<uint16_t*>(x.param_bf16.data<bf16>()) + lo, hi - lo, lr, b1, b2,
                           eps, wd, T(bc1), T(bc2), T(hp.grad_scale));
      else
        update<T, M, V, 0>(p, g, m, v, nullptr, hi - lo, lr, b1, b2, eps, wd, T(bc1), T(bc2), T(hp.grad_scale));
      at = start[k] + hi;
    }
  }
}
}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step) {
  std::vector<AdamWTensor> one{{param, grad, m, v, hp.weight_decay}};
  cpu::adamw_step_multi(one, hp, step);
}

void adamw_step_multi(std::vector<AdamWTensor>& ts, const AdamWParams& hp, int64_t step) {
  MOE_ASSERT(step >= 1);
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype(), md = ts.front().m.dtype(), vd = ts.front().v.dtype();
  for (const auto& x : ts) {
    MOE_ASSERT(x.param.device().is_cpu());
    MOE_ASSERT(x.param.numel() == x.grad.numel() && x.param.numel() == x.m.numel() && x.param.numel() == x.v.numel());
    MOE_ASSERT(x.param.dtype() == dt && x.grad.dtype() == dt && x.m.dtype() == md && x.v.dtype() == vd);
    MOE_ASSERT(!x.param_bf16.defined() ||
               (is_half(x.param_bf16.dtype()) && dt == DType::F32 && x.param_bf16.numel() == x.param.numel()));
  }
  // Moments in the parameters' dtype, or bf16 beside f32 parameters.
  MOE_ASSERT((md == dt || (md == DType::BF16 && dt == DType::F32)) &&
             (vd == dt || (vd == DType::BF16 && dt == DType::F32)));
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(step));
  if (md == DType::BF16 && vd == DType::BF16)
    step_all<float, bf16, bf16>(ts, hp, bc1, bc2);
  else if (md == DType::BF16)
    step_all<float, bf16, float>(ts, hp, bc1, bc2);
  else if (vd == DType::BF16)
    step_all<float, float, bf16>(ts, hp, bc1, bc2);
  else
    MOE_DISPATCH_FLOAT(dt, T, { step_all<T, T, T>(ts, hp, bc1, bc2); });
}

}  // namespace moecore::kernels::cpu
