// Multi-latent attention's block moves on the CPU (see mla_blocks.h): one thread per row; the head sum in ascending
// head order.
#include <algorithm>

#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

namespace {
template <typename T>
void move_block(const T* src, int64_t Ns, int64_t Ws, int64_t s0, T* dst, int64_t Nd, int64_t Wd, int64_t d0, int64_t w,
                int64_t R) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) {
    const T* sr = src + r * Ns * Ws + s0;
    T* dr = dst + r * Nd * Wd + d0;
    if (Nd == 1 && Ns > 1) {
      for (int64_t i = 0; i < w; i++) dr[i] = 0;
      for (int64_t n = 0; n < Ns; n++)
        for (int64_t i = 0; i < w; i++) dr[i] += sr[n * Ws + i];
      continue;
    }
    for (int64_t n = 0; n < Nd; n++) {
      const T* s = sr + (Ns == 1 ? 0 : n * Ws);
      std::copy(s, s + w, dr + n * Wd);
    }
  }
}
}  // namespace

void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows) {
  MOE_ASSERT(src.numel() == rows * Ns * Ws && dst.numel() == rows * Nd * Wd && src.dtype() == dst.dtype());
  MOE_ASSERT(s0 + w <= Ws && d0 + w <= Wd && (Ns == Nd || Ns == 1 || Nd == 1));
  MOE_DISPATCH_FLOAT(src.dtype(), T, move_block<T>(src.data<T>(), Ns, Ws, s0, dst.data<T>(), Nd, Wd, d0, w, rows));
}

// This backend's table (kernels/backends.h).
const MlaBlockKernels kMlaBlockKernels{mla_move_block};

}  // namespace moecore::kernels::cpu
