// Elementwise helpers on the CPU (see elementwise.h; the backend entry points in cpu/kernels.h).
#include "moecore/kernels/elementwise.h"

#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/kernels.h"

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

template <typename T, typename F>
MOE_TARGET_CLONES double chunked_sum(int64_t n, F term) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  // Partial sums per fixed chunk, then a sequential sum over chunks: same result for any thread count.
  double partial_stack[64];
  std::vector<double> partial_heap;
  double* partial = partial_stack;
  if (nchunks > 64) {
    partial_heap.resize(nchunks);
    partial = partial_heap.data();
  }
  _Pragma("omp parallel for schedule(static) if (nchunks > 1)") for (int64_t c = 0; c < nchunks; c++) {
    partial[c] = lane_sum(c * kChunk, std::min(n, (c + 1) * kChunk), term);
  }
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

void add_row_bias_(Tensor& y_TN, const Tensor& b_N) {
  const int64_t rows = y_TN.rows(), N = y_TN.cols();
  MOE_ASSERT(b_N.numel() == N && b_N.dtype() == y_TN.dtype());
  MOE_DISPATCH_FLOAT(y_TN.dtype(), T, {
    T* y = y_TN.data<T>();
    const T* b = b_N.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < rows; t++) for (int64_t j = 0; j < N; j++)
        y[t * N + j] += b[j];
  });
}

void accumulate_col_sums(const Tensor& dy_TN, Tensor& db_N) {
  const int64_t rows = dy_TN.rows(), N = dy_TN.cols();
  MOE_ASSERT(db_N.numel() == N && db_N.dtype() == dy_TN.dtype());
  constexpr int64_t kCols = 64;
  const int64_t nblk = (N + kCols - 1) / kCols;
  MOE_DISPATCH_FLOAT(dy_TN.dtype(), T, {
    const T* dy = dy_TN.data<T>();
    T* db = db_N.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t b = 0; b < nblk; b++) {
      const int64_t j0 = b * kCols, j1 = std::min(N, j0 + kCols);
      T acc[kCols] = {};
      for (int64_t t = 0; t < rows; t++)
        for (int64_t j = j0; j < j1; j++) acc[j - j0] += dy[t * N + j];
      for (int64_t j = j0; j < j1; j++) db[j] += acc[j - j0];
    }
  });
}

}  // namespace moecore::kernels::cpu

namespace moecore::kernels {

namespace {
template <typename R>
MOE_TARGET_CLONES int64_t zeros_in(const R* v, int64_t n) {
  int64_t z = 0;
#pragma omp parallel for reduction(+ : z) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) z += v[i] == R(0);
  return z;
}
}  // namespace

int64_t count_zeros(const Tensor& a) {
  cpu::require_cpu(a, "count_zeros");
  int64_t z = 0;
  MOE_DISPATCH_FLOAT(a.dtype(), R, { z = zeros_in<R>(a.data<R>(), a.numel()); });
  return z;
}

}  // namespace moecore::kernels
