// RMSNorm and LayerNorm rows on the GPU on both sides of kWarpRowMaxH (a warp per row up to 1024 wide, a block per
// row above): forward and input gradient against the CPU kernels run in f64 (within 1e-5), rows whose squares
// overflow f32 included (the overflow-safe path of both kernels), and bitwise reruns. Skipped without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/rmsnorm.h"

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

constexpr double kRowTol = 1e-5;
const std::vector<int64_t> kWidths = {7, 128, 1024, 1025, 2048};

// Random rows; row 2 scaled to 1e30, so its f32 sum of squares overflows.
Tensor rows_with_a_huge_one(int64_t T, int64_t H, uint64_t seed) {
  Tensor x = host_random({T, H}, seed);
  for (int64_t j = 0; j < H; j++) x.set_item(2 * H + j, x.item(2 * H + j) * 1e30);
  return x;
}
Tensor as_f64(const Tensor& t) {
  return t.to(DType::F64);
}

TEST(CudaNormRows, RmsNormOnBothSidesOfTheWarpWidthMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const int64_t T = 37;
  for (int64_t H : kWidths) {
    const Tensor x = rows_with_a_huge_one(T, H, 1), w = host_random({H}, 2), dy = host_random({T, H}, 3);
    Tensor y64 = Tensor::empty({T, H}, DType::F64), r64 = Tensor::empty({T}, DType::F64);
    rmsnorm_forward(as_f64(x), as_f64(w), 1e-6, y64, r64);
    auto run = [&] {
      Tensor y = Tensor::empty({T, H}, DType::F32, Device::cuda()), r = Tensor::empty({T}, DType::F32, Device::cuda());
      rmsnorm_forward(gpu(x), gpu(w), 1e-6, y, r);
      return std::pair{y, r};
    };
    const auto [y, r] = run();
    EXPECT_LT(rel_diff(y, y64), kRowTol) << "H " << H;
    EXPECT_TRUE(bitwise_equal(y, run().first)) << "H " << H;
    // The input gradient on ordinary rows (the CPU's rstd, so both use the same statistics).
    const Tensor xs = host_random({T, H}, 4);
    Tensor ys = Tensor::empty({T, H}, DType::F64), rs = Tensor::empty({T}, DType::F64);
    rmsnorm_forward(as_f64(xs), as_f64(w), 1e-6, ys, rs);
    Tensor dx64 = Tensor::empty({T, H}, DType::F64), dw64 = Tensor::zeros({H}, DType::F64);
    rmsnorm_backward(as_f64(dy), as_f64(xs), as_f64(w), rs, dx64, dw64);
    Tensor dx = Tensor::empty({T, H}, DType::F32, Device::cuda()), dw = Tensor::zeros({H}, DType::F32, Device::cuda());
    rmsnorm_backward(gpu(dy), gpu(xs), gpu(w), gpu(rs.to(DType::F32)), dx, dw);
    EXPECT_LT(rel_diff(dx, dx64), kRowTol) << "H " << H;
  }
}

TEST(CudaNormRows, LayerNormOnBothSidesOfTheWarpWidthMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const int64_t T = 37;
  for (int64_t H : kWidths) {
    const Tensor x = rows_with_a_huge_one(T, H, 11), w = host_random({H}, 12), b = host_random({H}, 13);
    const Tensor dy = host_random({T, H}, 14);
    Tensor y64 = Tensor::empty({T, H}, DType::F64), m64 = Tensor::empty({T}, DType::F64),
           r64 = Tensor::empty({T}, DType::F64);
    layernorm_forward(as_f64(x), as_f64(w), as_f64(b), 1e-6, y64, m64, r64);
    auto run = [&] {
      const Device g = Device::cuda();
      Tensor y = Tensor::empty({T, H}, DType::F32, g), m = Tensor::empty({T}, DType::F32, g),
             r = Tensor::empty({T}, DType::F32, g);
      layernorm_forward(gpu(x), gpu(w), gpu(b), 1e-6, y, m, r);
      return y;
    };
    const Tensor y = run();
    EXPECT_LT(rel_diff(y, y64), kRowTol) << "H " << H;
    EXPECT_TRUE(bitwise_equal(y, run())) << "H " << H;
    const Tensor xs = host_random({T, H}, 15, 2.0);
    Tensor ys = Tensor::empty({T, H}, DType::F64), ms = Tensor::empty({T}, DType::F64),
           rs = Tensor::empty({T}, DType::F64);
    layernorm_forward(as_f64(xs), as_f64(w), as_f64(b), 1e-6, ys, ms, rs);
    Tensor dx64 = Tensor::empty({T, H}, DType::F64), dw64 = Tensor::zeros({H}, DType::F64),
           db64 = Tensor::zeros({H}, DType::F64);
    layernorm_backward(as_f64(dy), as_f64(xs), as_f64(w), ms, rs, dx64, dw64, db64);
    const Device g = Device::cuda();
    Tensor dx = Tensor::empty({T, H}, DType::F32, g), dw = Tensor::zeros({H}, DType::F32, g),
           db = Tensor::zeros({H}, DType::F32, g);
    layernorm_backward(gpu(dy), gpu(xs), gpu(w), gpu(ms.to(DType::F32)), gpu(rs.to(DType::F32)), dx, dw, db);
    EXPECT_LT(rel_diff(dx, dx64), kRowTol) << "H " << H;
  }
}

}  // namespace
}  // namespace moecore::kernels
