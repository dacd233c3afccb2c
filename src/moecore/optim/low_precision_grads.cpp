// Megatron's fp16/bf16 main gradients, emulated in f32 storage (see low_precision_grads.h).
#include "moecore/optim/low_precision_grads.h"

#include <vector>

#include "moecore/core/dtype.h"
#include "moecore/core/error.h"

namespace moecore::optim {

namespace {

// x rounded to `low` (through f32: an f64 value of a gradient check is rounded to f32 first).
inline float round_one(float x, DType low) {
  if (low == DType::F16) return f16_to_float(float_to_f16(x));
  if (low == DType::BF16) return bf16_to_float(float_to_bf16(x));
  return x;
}

template <typename T>
inline T round_as(T x, DType low) {
  if (low == DType::F32 || low == DType::F64) return x;
  return static_cast<T>(round_one(static_cast<float>(x), low));
}

// What each rank puts into the collective: its value rounded to `low`, times pre_scale, rounded again (Megatron
// multiplies the low-precision buffer by gradient_scaling_factor in place).
template <typename T>
void round_and_scale(T* x, int64_t n, DType low, double pre_scale) {
  for (int64_t i = 0; i < n; i++) {
    T v = round_as(x[i], low);
    if (pre_scale != 1.0) v = round_as(static_cast<T>(static_cast<double>(v) * pre_scale), low);
    x[i] = v;
  }
}

// out[i] = the sum over ranks r of parts[r·stride + i], in rank order, each partial sum rounded to `low`.
template <typename T>
void ordered_sum(const T* parts, int64_t ranks, int64_t stride, int64_t n, DType low, T* out) {
  for (int64_t i = 0; i < n; i++) {
    T s = parts[i];
    for (int64_t r = 1; r < ranks; r++) s = round_as(static_cast<T>(s + parts[r * stride + i]), low);
    out[i] = s;
  }
}

void check_host(const Tensor& t) {
  MOE_ASSERT_MSG(t.device().is_cpu() && (t.dtype() == DType::F32 || t.dtype() == DType::F64),
                 "low-precision main gradients are emulated in f32 or f64 host tensors, not {} on {}",
                 dtype_name(t.dtype()), t.device().is_cpu() ? "the host" : "a GPU");
}

template <typename T>
void all_reduce_as(const comm::ProcessGroup& group, Tensor& t, DType low, double pre_scale) {
  const int64_t n = t.numel();
  Tensor mine = t.clone().reshape({n});
  round_and_scale(mine.data<T>(), n, low, pre_scale);
  Tensor all = Tensor::empty({group.size() * n}, t.dtype());
  group.all_gather(mine, all);
  Tensor sum = Tensor::empty({n}, t.dtype());
  ordered_sum(all.data<T>(), group.size(), n, n, low, sum.data<T>());
  t.copy_from(sum.reshape(t.shape()));
}

template <typename T>
void reduce_scatter_as(const comm::ProcessGroup& group, Tensor& buf, DType low, double pre_scale) {
  const int64_t size = group.size(), n = buf.numel() / size;
  MOE_ASSERT_MSG(n * size == buf.numel(), "a reduce-scatter buffer of {} elements over {} ranks", buf.numel(), size);
  Tensor flat = buf.reshape({buf.numel()});
  round_and_scale(flat.data<T>(), flat.numel(), low, pre_scale);
  // Every rank's region r goes to rank r: this rank receives the size parts of its own region, in rank order.
  const std::vector<int64_t> rows(static_cast<size_t>(size), n);
  Tensor parts = Tensor::empty({size * n}, buf.dtype());
  group.all_to_all_v(flat, rows, parts, rows);
  Tensor mine = flat.slice(group.rank() * n, n);
  ordered_sum(parts.data<T>(), size, n, n, low, mine.data<T>());
}

}  // namespace

void round_to_dtype(Tensor& t, DType low) {
  if (low == DType::F32 || low == DType::F64 || !t.defined() || t.numel() == 0) return;
  check_host(t);
  const int64_t n = t.numel();
  if (t.dtype() == DType::F32) {
    float* x = t.data<float>();
    for (int64_t i = 0; i < n; i++) x[i] = round_as(x[i], low);
  } else {
    double* x = t.data<double>();
    for (int64_t i = 0; i < n; i++) x[i] = round_as(x[i], low);
  }
}

void low_precision_all_reduce(const comm::ProcessGroup& group, Tensor& t, DType low, double pre_scale) {
  check_host(t);
  if (t.dtype() == DType::F32)
    all_reduce_as<float>(group, t, low, pre_scale);
  else
    all_reduce_as<double>(group, t, low, pre_scale);
}

void low_precision_reduce_scatter_in_place(const comm::ProcessGroup& group, Tensor& buf, DType low, double pre_scale) {
  check_host(buf);
  if (buf.dtype() == DType::F32)
    reduce_scatter_as<float>(group, buf, low, pre_scale);
  else
    reduce_scatter_as<double>(group, buf, low, pre_scale);
}

}  // namespace moecore::optim
