// Tensors on the GPU: allocation, copies both ways, conversion, the allocator's statistics, host access refused.
#include <gtest/gtest.h>

#include "cuda/gpu_util.h"
#include "moecore/core/tensor.h"
#include "moecore/device/runtime.h"

namespace moecore {
namespace {

TEST(CudaTensor, RoundTripsThroughTheGpu) {
  MOE_REQUIRE_GPU();
  Tensor h = Tensor::empty({3, 5}, DType::F32);
  for (int64_t i = 0; i < h.numel(); i++) h.set_item(i, 0.25 * static_cast<double>(i) - 1);
  const Tensor d = h.to(Device::cuda());
  EXPECT_TRUE(d.device().is_cuda());
  const Tensor back = d.to(Device::cpu());
  for (int64_t i = 0; i < h.numel(); i++) EXPECT_EQ(back.item(i), h.item(i));
  EXPECT_EQ(d.item(7), h.item(7));
}

TEST(CudaTensor, ConvertsDtypesOnTheGpuLikeTheHost) {
  MOE_REQUIRE_GPU();
  Tensor h = Tensor::empty({1000}, DType::F32);
  for (int64_t i = 0; i < h.numel(); i++) h.set_item(i, std::sin(0.37 * static_cast<double>(i)) * 3.3);
  const Tensor want = h.to(DType::BF16);
  const Tensor got = h.to(Device::cuda()).to(DType::BF16).to(Device::cpu());
  for (int64_t i = 0; i < h.numel(); i++) ASSERT_EQ(got.item(i), want.item(i)) << i;
}

TEST(CudaTensor, ZerosSlicesAndSetItem) {
  MOE_REQUIRE_GPU();
  Tensor d = Tensor::zeros({4, 2}, DType::F32, Device::cuda());
  d.set_item(5, 2.5);
  Tensor s = d.slice(2, 2);
  EXPECT_EQ(s.item(1), 2.5);
  EXPECT_EQ(d.to(Device::cpu()).item(0), 0.0);
}

TEST(CudaTensor, HostReadOfAGpuTensorIsAClearError) {
  MOE_REQUIRE_GPU();
  const Tensor d = Tensor::empty({2}, DType::F32, Device::cuda());
  try {
    (void)d.data<float>();
    FAIL() << "data() on a GPU tensor returned";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("was read from host code; copy it first with .to(Device::cpu())"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaTensor, SteadyStateAllocationsComeFromTheCache) {
  MOE_REQUIRE_GPU();
  const Device g = Device::cuda();
  { Tensor warm = Tensor::empty({1024, 256}, DType::F32, g); }
  const AllocatorMark m = device::device_allocator_mark(g);
  for (int i = 0; i < 10; i++) Tensor t = Tensor::empty({1024, 256}, DType::F32, g);
  EXPECT_EQ(device::device_system_allocs_since(g, m), 0);
  EXPECT_GE(device::device_allocator_stats(g).peak_bytes, 1024 * 256 * 4);
}

}  // namespace
}  // namespace moecore
