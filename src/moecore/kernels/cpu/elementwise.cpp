// Elementwise helpers on the CPU (see elementwise.h; the backend entry points in cpu/kernels.h).
#include "moecore/kernels/elementwise.h"

#include <algorithm>
#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels::cpu {

namespace {
constexpr int64_t kChunk = 16384;
// Independent f64 accumulators per chunk: a single running sum is one dependent add per element, bound by the add's
// latency (the gradient norm's sum of squares runs over every gradient each step); lane l sums
// elements l, l + kSumLanes, ... and the lanes are added in order, so the compiler can keep them in vector registers.
constexpr int64_t kSumLanes = 16;
static_assert(kChunk % kSumLanes == 0);

// Σ term(i) over [begin, end) in the fixed lane order above.
template <typename F>
inline __attribute__((always_inline)) double lane_sum(int64_t begin, int64_t end, F term) {
  double acc[kSumLanes] = {};
  int64_t i = begin;
  for (; i + kSumLanes <= end; i += kSumLanes)
#pragma omp simd
    for (int64_t l = 0; l < kSumLanes; l++) acc[l] += term(i + l);
  double s = 0;
  for (int64_t l = 0; l < kSumLanes; l++) s += acc[l];
  for (; i < end; i++) s += term(i);
  return s;
}

// partial[c] = the sum of chunk c, the chunks shared among the calling team.
template <typename F>
MOE_ALWAYS_INLINE void chunk_sums(int64_t n, int64_t nchunks, F term, double* partial) {
#pragma omp for schedule(static)
  for (int64_t c = 0; c < nchunks; c++) partial[c] = lane_sum(c * kChunk, std::min(n, (c + 1) * kChunk), term);
}

template <typename T, typename F>
double chunked_sum(int64_t n, F term) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  // Partial sums per fixed chunk, then a sequential sum over chunks: same result for any thread count.
  double partial_stack[64];
  std::vector<double> partial_heap;
  double* partial = partial_stack;
  if (nchunks > 64) {
    partial_heap.resize(nchunks);
    partial = partial_heap.data();
  }
#pragma omp parallel if (nchunks > 1)
  MOE_CPU_CLONES(chunk_sums(n, nchunks, term, partial));
  double s = 0;
  for (int64_t c = 0; c < nchunks; c++) s += partial[c];
  return s;
}
}  // namespace

void add_(Tensor& a, const Tensor& b) {
  add(a, b, a);
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  MOE_ASSERT_MSG(a.numel() == b.numel() && a.numel() == out.numel(), "add of {} + {} into {}", a.shape().str(),
                 b.shape().str(), out.shape().str());
  MOE_ASSERT(a.dtype() == b.dtype() && a.dtype() == out.dtype());
  const int64_t n = a.numel();
  MOE_DISPATCH_FLOAT(a.dtype(), T, {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    _Pragma("omp parallel for schedule(static) if (n > 65536)") for (int64_t i = 0; i < n; i++) po[i] = pa[i] + pb[i];
  });
}

void scale_(Tensor& a, double s) {
  const int64_t n = a.numel();
  MOE_DISPATCH_FLOAT(a.dtype(), T, {
    T* p = a.data<T>();
    const T ts = static_cast<T>(s);
    _Pragma("omp parallel for schedule(static) if (n > 65536)") for (int64_t i = 0; i < n; i++) p[i] *= ts;
  });
}

void fill_(Tensor& a, double v) {
  const int64_t n = a.numel();
  MOE_DISPATCH_FLOAT(a.dtype(), T, {
    T* p = a.data<T>();
    for (int64_t i = 0; i < n; i++) p[i] = static_cast<T>(v);
  });
}

double sum(const Tensor& a) {
  double r = 0;
  MOE_DISPATCH_FLOAT(a.dtype(), T, {
    const T* p = a.data<T>();
    r = chunked_sum<T>(a.numel(), [p](int64_t i) { return static_cast<double>(p[i]); });
  });
  return r;
}

double dot(const Tensor& a, const Tensor& b) {
  MOE_ASSERT(a.numel() == b.numel() && a.dtype() == b.dtype());
  double r = 0;
  MOE_DISPATCH_FLOAT(a.dtype(), T, {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    r = chunked_sum<T>(a.numel(), [pa, pb](int64_t i) { return static_cast<double>(pa[i]) * pb[i]; });
  });
  return r;
}

double sum_squares(const Tensor& a) {
  return dot(a, a);
}

namespace {
// fn(e, r) for each row r of each segment e: one parallel region; each segment's rows are shared out without a
// barrier between segments (they are disjoint).
template <typename Fn>
void for_segment_rows(const RowSegments& seg, Fn fn) {
  const int64_t E = static_cast<int64_t>(seg.begin.size());
#pragma omp parallel
  for (int64_t e = 0; e < E; e++) {
    const int64_t r0 = seg.begin[e], r1 = r0 + seg.count[e];
#pragma omp for schedule(static) nowait
    for (int64_t r = r0; r < r1; r++) fn(e, r);
  }
}

// T: the computation's type (b, w, db, dw); Y: y's or dy's storage (T, or bf16).
template <typename T, typename Y>
void bias_rows(const T* b, const T* w, const RowSegments& seg, int64_t N, Y* y) {
  for_segment_rows(seg, [=](int64_t e, int64_t r) {
    const T s = w ? w[r] : T(1);  // b·1 is b exactly: the unweighted sum has the plain bias add's bits
    const T* be = b + e * N;
    Y* yr = y + r * N;
    for (int64_t j = 0; j < N; j++) store_as(yr + j, load_as<T>(yr + j) + be[j] * s);
  });
}

// db[e, j] += Σ_{r ∈ e} w_r·dy[r, j], rows in order per block of 64 columns.
template <typename T, typename Y>
void bias_col_sums(const Y* dy, const T* w, const RowSegments& seg, int64_t N, T* db) {
  constexpr int64_t kCols = 64;
  const int64_t E = static_cast<int64_t>(seg.begin.size()), nblk = (N + kCols - 1) / kCols;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t e = 0; e < E; e++)
    for (int64_t blk = 0; blk < nblk; blk++) {
      const int64_t j0 = blk * kCols, j1 = std::min(N, j0 + kCols);
      T acc[kCols] = {};
      for (int64_t r = seg.begin[e]; r < seg.begin[e] + seg.count[e]; r++) {
        const T s = w ? w[r] : T(1);
        for (int64_t j = j0; j < j1; j++) acc[j - j0] += load_as<T>(dy + r * N + j) * s;
      }
      for (int64_t j = j0; j < j1; j++) db[e * N + j] += acc[j - j0];
    }
}

// dw[r] += dy[r, :]·b[e], columns in order.
template <typename T, typename Y>
void bias_row_dots(const Y* dy, const T* b, const RowSegments& seg, int64_t N, T* dw) {
  for_segment_rows(seg, [=](int64_t e, int64_t r) {
    const T* be = b + e * N;
    T s = 0;
    for (int64_t j = 0; j < N; j++) s += load_as<T>(dy + r * N + j) * be[j];
    dw[r] += s;
  });
}
}  // namespace

void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN) {
  const int64_t N = y_RN.cols();
  const DType ct = b_EN.dtype();
  MOE_ASSERT(y_RN.dtype() == ct || (is_half(y_RN.dtype()) && ct == DType::F32));
  MOE_ASSERT(!w_R || w_R->dtype() == ct);
  MOE_DISPATCH_FLOAT(ct, T, {
    const T* w = w_R ? w_R->data<T>() : nullptr;
    with_storage<T>(y_RN.dtype(), [&](auto* yt) {
      using Y = storage_t<decltype(yt)>;
      bias_rows<T, Y>(b_EN.data<T>(), w, seg, N, y_RN.data<Y>());
    });
  });
}

void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                           const Tensor* b_EN, Tensor* dw_R) {
  const int64_t N = dy_RN.cols();
  const DType ct = db_EN.dtype();
  MOE_ASSERT(dy_RN.dtype() == ct || (is_half(dy_RN.dtype()) && ct == DType::F32));
  MOE_ASSERT(!w_R || w_R->dtype() == ct);
  MOE_ASSERT(!dw_R || (b_EN->dtype() == ct && dw_R->dtype() == ct));
  MOE_DISPATCH_FLOAT(ct, T, {
    const T* w = w_R ? w_R->data<T>() : nullptr;
    with_storage<T>(dy_RN.dtype(), [&](auto* yt) {
      using Y = storage_t<decltype(yt)>;
      bias_col_sums<T, Y>(dy_RN.data<Y>(), w, seg, N, db_EN.data<T>());
      if (dw_R) bias_row_dots<T, Y>(dy_RN.data<Y>(), b_EN->data<T>(), seg, N, dw_R->data<T>());
    });
  });
}

namespace {
// The zeros in this thread's share of v.
template <typename R>
MOE_ALWAYS_INLINE int64_t zeros_in_body(const R* v, int64_t n) {
  int64_t z = 0;
#pragma omp for schedule(static) nowait
  for (int64_t i = 0; i < n; i++) z += v[i] == R(0);
  return z;
}
template <typename R>
int64_t zeros_in(const R* v, int64_t n) {
  int64_t z = 0;
#pragma omp parallel reduction(+ : z) if (n > 65536)
  z += MOE_CPU_CLONES(zeros_in_body(v, n));
  return z;
}
}  // namespace

int64_t count_zeros(const Tensor& a) {
  require_cpu(a, "count_zeros");
  int64_t z = 0;
  MOE_DISPATCH_FLOAT(a.dtype(), R, { z = zeros_in<R>(a.data<R>(), a.numel()); });
  return z;
}

// This backend's table (kernels/backends.h).
const ElementwiseKernels kElementwiseKernels{
    add_,     add, scale_, fill_, sum, dot, sum_squares, count_zeros, segment_bias_forward, segment_bias_backward,
    copy_cols};

}  // namespace moecore::kernels::cpu
