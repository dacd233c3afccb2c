// Multi-latent attention's block moves on the GPU (kernels/mla_blocks.h; declared in kernels.h): f32 or f64, strided
// copies (copy_2d) and, for the head sum, one kernel.
#include "moecore/device/runtime.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_mla.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using detail::check_launch;

void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows) {
  const Device dev = src.device();
  MOE_ASSERT_MSG(dev.is_cuda() && dst.device() == dev, "MLA block move from {} to {}: both must be on one GPU",
                 dev.str(), dst.device().str());
  MOE_ASSERT(src.dtype() == dst.dtype() && (src.dtype() == DType::F32 || src.dtype() == DType::F64));
  MOE_ASSERT(src.numel() == rows * Ns * Ws && dst.numel() == rows * Nd * Wd);
  MOE_ASSERT(s0 >= 0 && d0 >= 0 && w >= 0 && s0 + w <= Ws && d0 + w <= Wd && (Ns == Nd || Ns == 1 || Nd == 1));
  if (w == 0 || rows == 0) return;
  if (Nd == 1 && Ns > 1) {
    const cudaStream_t s = moecore::device::current_stream();
    if (src.dtype() == DType::F32)
      launch::mla_head_sum_f32(src.device_data<float>(), Ns, Ws, s0, dst.device_data<float>(), Wd, d0, w, rows, s);
    else
      launch::mla_head_sum_f64(src.device_data<double>(), Ns, Ws, s0, dst.device_data<double>(), Wd, d0, w, rows, s);
    check_launch("mla_head_sum");
    return;
  }
  const size_t e = dtype_size(src.dtype()), width = static_cast<size_t>(w) * e;
  const char* from = static_cast<const char*>(src.raw()) + static_cast<size_t>(s0) * e;
  char* to = static_cast<char*>(dst.raw()) + static_cast<size_t>(d0) * e;
  if (Ns == Nd) {  // head n of row r is row r·N + n of a [rows·N, W] matrix on both sides
    moecore::device::copy_2d(to, static_cast<size_t>(Wd) * e, from, static_cast<size_t>(Ws) * e, width,
                             static_cast<size_t>(rows * Nd), dev);
    return;
  }
  for (int64_t n = 0; n < Nd; n++)  // broadcast: the one source head into each destination head
    moecore::device::copy_2d(to + static_cast<size_t>(n * Wd) * e, static_cast<size_t>(Nd * Wd) * e, from,
                             static_cast<size_t>(Ws) * e, width, static_cast<size_t>(rows), dev);
}

// This backend's table (kernels/backends.h).
const MlaBlockKernels kMlaBlockKernels{mla_move_block};

}  // namespace moecore::kernels::cuda
