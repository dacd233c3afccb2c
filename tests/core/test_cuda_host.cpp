// The CUDA backend's host-side parts, on any machine: the caching allocator's bookkeeping against a fake backend,
// --device parsing and the refusals of a GPU that cannot be used (cuda/device_select.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "moecore/core/tensor.h"
#include "moecore/device/caching_allocator.h"
#include "moecore/device/device_select.h"
#include "moecore/device/runtime.h"
#include "test_util.h"

namespace moecore::device {
namespace {

// Host memory standing in for a GPU: counts the raw calls and can be told to run out.
struct FakeGpu {
  int64_t allocs = 0, releases = 0, syncs = 0;
  size_t limit = size_t(1) << 40, used = 0;
  std::set<void*> live;
  RawBackend backend() {
    RawBackend b;
    b.name = "fake GPU";
    b.allocate = [this](size_t n) -> void* {
      if (used + n > limit) return nullptr;
      void* p = std::malloc(n);
      allocs++, used += n;
      live.insert(p);
      sizes[p] = n;
      return p;
    };
    b.release = [this](void* p) {
      releases++, used -= sizes[p];
      live.erase(p);
      std::free(p);
    };
    b.synchronize = [this] { syncs++; };
    return b;
  }
  std::map<void*, size_t> sizes;
};

TEST(CachingAllocator, ReusesBlocksOnTheSameStreamOnly) {
  FakeGpu gpu;
  CachingAllocator a(gpu.backend());
  void* p = a.allocate(1000, /*stream=*/1);
  a.deallocate(p);
  EXPECT_EQ(a.cached_blocks(1), 1);
  void* q = a.allocate(1000, 1);  // same stream, same class: the cached block, no raw call
  EXPECT_EQ(q, p);
  EXPECT_EQ(gpu.allocs, 1);
  a.deallocate(q);
  void* r = a.allocate(1000, 2);  // another stream must not take it: its queued work may still use it
  EXPECT_NE(r, p);
  EXPECT_EQ(gpu.allocs, 2);
  a.deallocate(r);
  EXPECT_EQ(a.cached_blocks(1), 1);
  EXPECT_EQ(a.cached_blocks(2), 1);
}

TEST(CachingAllocator, KeepsTheCpuAllocatorsStatistics) {
  FakeGpu gpu;
  CachingAllocator a(gpu.backend());
  const size_t s1 = CachingAllocator::round_size(3000), s2 = CachingAllocator::round_size(100);
  EXPECT_EQ(s2, 512u);                         // the 512-byte minimum
  EXPECT_EQ(s1, Allocator::round_size(3000));  // above the minimum: the CPU allocator's classes
  const AllocatorMark m = a.mark();
  void* x = a.allocate(3000, 0);
  void* y = a.allocate(100, 0);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.live_bytes, static_cast<int64_t>(s1 + s2));
  EXPECT_EQ(st.peak_bytes, st.live_bytes);
  a.deallocate(x);
  st = a.stats();
  EXPECT_EQ(st.live_bytes, static_cast<int64_t>(s2));
  EXPECT_EQ(st.cached_bytes, static_cast<int64_t>(s1));
  EXPECT_EQ(st.peak_bytes, static_cast<int64_t>(s1 + s2));
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_bytes, static_cast<int64_t>(s2));
  EXPECT_EQ(a.requests_since(m), 2);
  EXPECT_EQ(a.system_allocs_since(m), 2);
  // A steady state: the same sizes again take nothing from the backend.
  const AllocatorMark m2 = a.mark();
  for (int i = 0; i < 5; i++) a.deallocate(a.allocate(3000, 0));
  EXPECT_EQ(a.system_allocs_since(m2), 0);
  EXPECT_EQ(a.requests_since(m2), 5);
  a.deallocate(y);
  a.empty_cache();
  EXPECT_EQ(a.stats().cached_bytes, 0);
  EXPECT_EQ(a.stats().system_bytes, 0);
  EXPECT_TRUE(gpu.live.empty());
  EXPECT_EQ(gpu.syncs, 1);  // cached blocks go back only after the streams are done with them
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheThenSaysHowMuchIsInUse) {
  FakeGpu gpu;
  gpu.limit = 8192;
  CachingAllocator a(gpu.backend());
  void* p = a.allocate(4096, 7);
  a.deallocate(p);                // cached on stream 7
  void* q = a.allocate(6000, 0);  // does not fit next to the cached block: the cache is released, then it fits
  EXPECT_EQ(gpu.releases, 1);
  EXPECT_EQ(gpu.syncs, 1);
  EXPECT_EQ(a.cached_blocks(7), 0);
  const std::string msg = moecore::testing::error_of([&] { a.allocate(6000, 0); });
  EXPECT_NE(msg.find("out of fake GPU memory: could not allocate 6000 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
  a.deallocate(q);
}

TEST(CachingAllocator, DoubleFreeIsCaught) {
  FakeGpu gpu;
  CachingAllocator a(gpu.backend());
  void* p = a.allocate(64, 0);
  a.deallocate(p);
  EXPECT_THROW(a.deallocate(p), InternalError);
}

TEST(DeviceSelect, ParsesTheAcceptedNames) {
  for (const char* ok : {"auto", "cpu", "cuda", "cuda:0", "cuda:3"}) EXPECT_TRUE(is_device_name(ok)) << ok;
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda:1a"})
    EXPECT_FALSE(is_device_name(bad)) << bad;
  const std::string msg = moecore::testing::error_of([] { resolve_device("gpu", "train", DeviceAvailability{}); });
  EXPECT_NE(msg.find("--device gpu: not a device; accepted: auto, cpu, cuda, cuda:N"), std::string::npos) << msg;
}

TEST(DeviceSelect, AutoTakesTheGpuOnlyWhereOneIsUsable) {
  DeviceAvailability none{false, 0, "this moecore was built without CUDA"};
  EXPECT_TRUE(resolve_device("auto", "train", none).is_cpu());
  DeviceAvailability no_gpu{true, 0, "cudaGetDeviceCount: no CUDA-capable device is detected"};
  EXPECT_TRUE(resolve_device("auto", "train", no_gpu).is_cpu());
  DeviceAvailability two{true, 2, ""};
  EXPECT_EQ(resolve_device("auto", "train", two), Device::cuda(0));
  EXPECT_EQ(resolve_device("cuda:1", "train", two), Device::cuda(1));
  EXPECT_TRUE(resolve_device("cpu", "train", two).is_cpu());
}

TEST(DeviceSelect, RefusesAGpuThatCannotBeUsed) {
  const std::string built = moecore::testing::error_of([] {
    resolve_device("cuda", "bench gemm", DeviceAvailability{false, 0, "x"});
  });
  EXPECT_NE(built.find("--device cuda: this moecore was built without CUDA, so `moecore bench gemm` cannot use a GPU"),
            std::string::npos)
      << built;
  const std::string none = moecore::testing::error_of([] {
    resolve_device("cuda", "train", DeviceAvailability{true, 0, "cudaGetDeviceCount: no device"});
  });
  EXPECT_NE(none.find("--device cuda: no GPU is visible to this process (cudaGetDeviceCount: no device); use --device "
                      "cpu or --device auto"),
            std::string::npos)
      << none;
  const std::string range = moecore::testing::error_of([] {
    resolve_device("cuda:2", "train", DeviceAvailability{true, 2, ""});
  });
  EXPECT_NE(range.find("--device cuda:2: this process sees 2 GPU(s), numbered 0 to 1"), std::string::npos) << range;
}

TEST(DeviceSelect, ThisMachineAnswersConsistently) {
  const DeviceAvailability a = DeviceAvailability::probe();
  EXPECT_EQ(a.built_with_cuda, built_with_cuda());
#ifdef MOECORE_HAVE_CUDA
  EXPECT_TRUE(a.built_with_cuda);
#else
  EXPECT_FALSE(a.built_with_cuda);
#endif
  if (a.visible == 0) {
    EXPECT_FALSE(a.why_none.empty());
    EXPECT_TRUE(resolve_device("auto", "train").is_cpu());
    EXPECT_THROW(resolve_device("cuda", "train"), Error);
    // No GPU: a GPU tensor cannot be made, and says why.
    if (!a.built_with_cuda) {
      const std::string msg = moecore::testing::error_of([] { Tensor::empty({2}, DType::F32, Device::cuda()); });
      EXPECT_NE(msg.find("built without CUDA"), std::string::npos) << msg;
    }
  }
}

TEST(DeviceTensor, CpuTensorsSayTheyAreOnTheCpu) {
  const Tensor t = Tensor::zeros({2, 3}, DType::F32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.device().str(), "cpu");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_TRUE(t.to(Device::cpu()).shares_storage(t));  // already there: no copy
  EXPECT_TRUE(t.slice(1, 1).device().is_cpu());
}

}  // namespace
}  // namespace moecore::device
