// Activations (see activation.h). Derivatives, with σ the logistic function and Φ/φ the normal CDF/PDF:
//   SwiGLU  y = silu(a)·b,  silu(a) = a·σ(a),  silu'(a) = σ(a)·(1 + a·(1 − σ(a)))
//           da = dy·b·silu'(a),  db = dy·silu(a)
//   GeLU    y = x·Φ(x) (exact erf form, Megatron's default),  y' = Φ(x) + x·φ(x)
//   sqReLU  y = max(x, 0)²,  y' = 2·max(x, 0)
// With a row scale p: y = f(x)·p, so dx = f'(x)·dy·p and dp = Σ_j dy_j·f(x)_j.
#include "moecore/kernels/activation.h"

#include <cmath>
#include <type_traits>

#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels {

Activation parse_activation(std::string_view name) {
  if (name == "swiglu") return Activation::SwiGLU;
  if (name == "gelu") return Activation::GeLU;
  if (name == "squared-relu" || name == "squared_relu") return Activation::SquaredReLU;
  MOE_CHECK(false, "unknown activation '{}'; choose one of swiglu, gelu, squared-relu", name);
  return Activation::SwiGLU;
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::SwiGLU:
      return "swiglu";
    case Activation::GeLU:
      return "gelu";
    case Activation::SquaredReLU:
      return "squared-relu";
  }
  return "?";
}

}  // namespace moecore::kernels

namespace moecore::kernels::cpu {

namespace {
template <typename T>
inline T sigmoid(T a) {
  return T(1) / (T(1) + vexp(-a));
}

// f(x) and f'(x) for the ungated activations.
template <typename T>
inline void act_and_grad(Activation act, T x, T& f, T& df) {
  if (act == Activation::GeLU) {
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
    const T pdf = std::exp(T(-0.5) * x * x) * T(0.3989422804014327);
    f = x * cdf;
    df = cdf + x * pdf;
  } else {
    const T r = x > T(0) ? x : T(0);
    f = r * r;
    df = T(2) * r;
  }
}

// T: the arithmetic (and probabilities') type; X: x's storage (T, or bf16 from a bf16 GEMM output); O: y's.
template <typename T, typename X, typename O>
MOE_ALWAYS_INLINE void fwd_body(Activation act, const X* x, const T* p, O* y, int64_t rows, int64_t F) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    const T scale = p ? p[t] : T(1);
    O* yr = y + t * F;
    if (act == Activation::SwiGLU) {
      const X* a = x + t * 2 * F;
      const X* b = a + F;
#pragma omp simd
      for (int64_t j = 0; j < F; j++) {
        const T aj = load_as<T>(a + j);
        store_as(yr + j, aj * sigmoid(aj) * load_as<T>(b + j) * scale);
      }
    } else {
      const X* xr = x + t * F;
      for (int64_t j = 0; j < F; j++) {
        T f, df;
        act_and_grad(act, load_as<T>(xr + j), f, df);
        store_as(yr + j, f * scale);
      }
    }
  }
}
template <typename T, typename X, typename O>
void fwd(Activation act, const X* x, const T* p, O* y, int64_t rows, int64_t F) {
#pragma omp parallel
  MOE_CPU_CLONES(fwd_body<T, X, O>(act, x, p, y, rows, F));
}

// Y: dy's storage (T, or bf16 from a bf16 GEMM output).
template <typename T, typename X, typename O, typename Y>
MOE_ALWAYS_INLINE void bwd_body(Activation act, const Y* dy, const X* x, const T* p, O* dx, T* dp, int64_t rows,
                                int64_t F) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    const T scale = p ? p[t] : T(1);
    const Y* dyr = dy + t * F;
    T dps = 0;
    if (act == Activation::SwiGLU) {
      const X* a = x + t * 2 * F;
      const X* b = a + F;
      O* da = dx + t * 2 * F;
      O* db = da + F;
#pragma omp simd reduction(+ : dps)
      for (int64_t j = 0; j < F; j++) {
        const T aj = load_as<T>(a + j), bj = load_as<T>(b + j), dyj = load_as<T>(dyr + j);
        const T s = sigmoid(aj);
        const T silu = aj * s;
        const T g = dyj * scale;
        store_as(da + j, g * bj * s * (T(1) + aj * (T(1) - s)));
        store_as(db + j, g * silu);
        dps += dyj * silu * bj;
      }
    } else {
      const X* xr = x + t * F;
      O* dxr = dx + t * F;
      for (int64_t j = 0; j < F; j++) {
        T f, df;
        act_and_grad(act, load_as<T>(xr + j), f, df);
        const T dyj = load_as<T>(dyr + j);
        store_as(dxr + j, dyj * scale * df);
        dps += dyj * f;
      }
    }
    if (dp) dp[t] = dps;
  }
}
template <typename T, typename X, typename O, typename Y = T>
void bwd(Activation act, const Y* dy, const X* x, const T* p, O* dx, T* dp, int64_t rows, int64_t F) {
#pragma omp parallel
  MOE_CPU_CLONES(bwd_body<T, X, O, Y>(act, dy, x, p, dx, dp, rows, F));
}
}  // namespace

void activation_forward(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF) {
  const int64_t rows = x.rows(), F = y_TF.cols();
  MOE_ASSERT_MSG(x.cols() == (is_gated(act) ? 2 * F : F) && y_TF.rows() == rows, "{} input {} output {}",
                 activation_name(act), x.shape().str(), y_TF.shape().str());
  MOE_ASSERT(!probs_T || probs_T->numel() == rows);
  // x may be bf16 (an f32 computation on the widened values); y f32/f64 like the computation, or bf16 from f32.
  const DType ct = is_half(x.dtype()) ? DType::F32 : x.dtype();
  MOE_ASSERT(y_TF.dtype() == ct || (is_half(y_TF.dtype()) && ct == DType::F32));
  MOE_ASSERT(!probs_T || probs_T->dtype() == ct);
  MOE_DISPATCH_FLOAT(ct, T, {
    const T* p = probs_T ? probs_T->data<T>() : nullptr;
    with_storage<T>(x.dtype(), [&](auto* xt) {
      with_storage<T>(y_TF.dtype(), [&](auto* yt) {
        using X = storage_t<decltype(xt)>;
        using Y = storage_t<decltype(yt)>;
        fwd<T, X, Y>(act, x.data<X>(), p, y_TF.data<Y>(), rows, F);
      });
    });
  });
}

void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                         Tensor* dprobs_T) {
  const int64_t rows = x.rows(), F = dy_TF.cols();
  MOE_ASSERT(dx.shape() == x.shape() && dy_TF.rows() == rows);
  MOE_ASSERT(x.cols() == (is_gated(act) ? 2 * F : F));
  MOE_ASSERT(!probs_T || probs_T->numel() == rows);
  MOE_ASSERT(!dprobs_T || dprobs_T->numel() == rows);
  const DType ct = is_half(x.dtype()) ? DType::F32 : x.dtype();  // as in forward
  MOE_ASSERT(dx.dtype() == ct || (is_half(dx.dtype()) && ct == DType::F32));
  // dy bf16 (f16; a 16-bit GEMM's output) goes with x and dx of its dtype: --bf16 (--fp16) training's expert backward.
  const bool dy16 = is_half(dy_TF.dtype());
  MOE_ASSERT(dy_TF.dtype() == ct || (dy16 && x.dtype() == dy_TF.dtype() && dx.dtype() == dy_TF.dtype()));
  MOE_ASSERT((!probs_T || probs_T->dtype() == ct) && (!dprobs_T || dprobs_T->dtype() == ct));
  if (dy16) {
    const float* p = probs_T ? probs_T->data<float>() : nullptr;
    float* dp = dprobs_T ? dprobs_T->data<float>() : nullptr;
    if (dy_TF.dtype() == DType::F16)
      return bwd<float, f16, f16, f16>(act, dy_TF.data<f16>(), x.data<f16>(), p, dx.data<f16>(), dp, rows, F);
    return bwd<float, bf16, bf16, bf16>(act, dy_TF.data<bf16>(), x.data<bf16>(), p, dx.data<bf16>(), dp, rows, F);
  }
  MOE_DISPATCH_FLOAT(ct, T, {
    const T* p = probs_T ? probs_T->data<T>() : nullptr;
    T* dp = dprobs_T ? dprobs_T->data<T>() : nullptr;
    with_storage<T>(x.dtype(), [&](auto* xt) {
      with_storage<T>(dx.dtype(), [&](auto* dxt) {
        using X = storage_t<decltype(xt)>;
        using DX = storage_t<decltype(dxt)>;
        bwd<T, X, DX>(act, dy_TF.data<T>(), x.data<X>(), p, dx.data<DX>(), dp, rows, F);
      });
    });
  });
}

// This backend's table (kernels/backends.h).
const ActivationKernels kActivationKernels{activation_forward, activation_backward};

}  // namespace moecore::kernels::cpu
