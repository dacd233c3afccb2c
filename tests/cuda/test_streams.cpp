// Streams, events and pinned buffers (CUDA builds only), and the allocator's per-stream reuse on a real GPU.
#include <gtest/gtest.h>

#include "cuda/gpu_util.h"
#include "moecore/core/tensor.h"
#include "moecore/device/runtime.h"

#ifdef MOECORE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "moecore/device/check.h"
#include "moecore/device/stream.h"

namespace moecore::device {
namespace {

TEST(CudaStreams, AllocationsFollowTheCurrentStream) {
  MOE_REQUIRE_GPU();
  const Device g = Device::cuda();
  Stream side;
  { Tensor t = Tensor::empty({4096}, DType::F32, g); }  // cached on the default stream
  const AllocatorMark m = device_allocator_mark(g);
  {
    StreamGuard guard(side.get());
    EXPECT_EQ(current_stream(), side.get());
    Tensor t = Tensor::empty({4096}, DType::F32, g);  // another stream: not the default stream's cached block
    t.zero_();
    side.synchronize();
  }
  EXPECT_EQ(device_system_allocs_since(g, m), 1);
  EXPECT_EQ(current_stream(), nullptr);
}

TEST(CudaStreams, EventsTimeAndOrderWork) {
  MOE_REQUIRE_GPU();
  Stream a, b;
  Event start(true), stop(true), done;
  Tensor x = Tensor::zeros({1 << 20}, DType::F32, Device::cuda());
  start.record(a.get());
  {
    StreamGuard guard(a.get());
    x.zero_();
  }
  stop.record(a.get());
  done.record(a.get());
  done.wait_on(b.get());  // b waits for a's work without blocking the host
  b.synchronize();
  stop.synchronize();
  EXPECT_GE(stop.ms_since(start), 0.0f);
}

TEST(CudaStreams, PinnedBuffersCopyBothWays) {
  MOE_REQUIRE_GPU();
  PinnedBuffer buf(64 * sizeof(float));
  float* h = static_cast<float*>(buf.data());
  for (int i = 0; i < 64; i++) h[i] = static_cast<float>(i) * 0.5f;
  Tensor d = Tensor::empty({64}, DType::F32, Device::cuda());
  MOE_CUDA_CHECK(cudaMemcpy(d.raw(), h, buf.size(), cudaMemcpyHostToDevice));
  PinnedBuffer moved = std::move(buf);
  EXPECT_EQ(buf.data(), nullptr);
  EXPECT_EQ(d.item(63), 31.5);
}

TEST(CudaStreams, ErrorsNameTheCallAndTheCudaError) {
  MOE_REQUIRE_GPU();
  try {
    MOE_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL() << "an invalid device was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA call cudaSetDevice(1 << 20) failed: cudaErrorInvalidDevice"), std::string::npos) << msg;
  }
  // The error thrown is not left as the thread's last error: the next call that reads it (CUB's radix-sort size
  // query in CudaDispatch, the launch checks) would fail on this one.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace moecore::device
#endif
