// The learned position embedding's row ops on the CPU (see position_rows.h): one thread per position, the batch walked
// in order.
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

namespace {
template <typename T>
void add_rows(T* h, const T* table, int64_t S, int64_t B, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; s++)
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < H; j++) h[(s * B + b) * H + j] += table[s * H + j];
}
// Fixed order per row: b ascending.
template <typename T>
void sum_rows(const T* dh, T* grad, int64_t S, int64_t B, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; s++)
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < H; j++) grad[s * H + j] += dh[(s * B + b) * H + j];
}
}  // namespace

void position_add_rows(Tensor& h_nBH, const Tensor& table_nH) {
  const int64_t n = h_nBH.dim(0), B = h_nBH.dim(1), H = h_nBH.dim(2);
  MOE_ASSERT(table_nH.numel() == n * H && table_nH.dtype() == h_nBH.dtype());
  MOE_DISPATCH_FLOAT(h_nBH.dtype(), T, { add_rows<T>(h_nBH.data<T>(), table_nH.data<T>(), n, B, H); });
}

void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH) {
  const int64_t n = dh_nBH.dim(0), B = dh_nBH.dim(1), H = dh_nBH.dim(2);
  MOE_ASSERT(grad_nH.numel() == n * H && grad_nH.dtype() == dh_nBH.dtype());
  MOE_DISPATCH_FLOAT(grad_nH.dtype(), T, { sum_rows<T>(dh_nBH.data<T>(), grad_nH.data<T>(), n, B, H); });
}

// This backend's table (kernels/backends.h).
const PositionRowsKernels kPositionRowsKernels{position_add_rows, position_sum_rows};

}  // namespace moecore::kernels::cpu
