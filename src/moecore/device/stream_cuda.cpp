// Streams, events, pinned buffers and the error throwers (see stream.h, check.h).
#include <fmt/format.h>

#include "moecore/core/error.h"
#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"

namespace moecore::device {

void throw_cuda_error(const char* call, cudaError_t e, const char* file, int line) {
  // The runtime also keeps the error as this thread's last error: consume it, so that a caller who catches this one
  // does not see it again from the next unrelated launch check (or from CUB, which reads it).
  (void)cudaGetLastError();
  throw Error(fmt::format("CUDA call {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(e), cudaGetErrorString(e),
                          file, line));
}

void throw_cublas_error(const char* call, cublasStatus_t s, const char* file, int line) {
  throw Error(fmt::format("cuBLAS call {} failed: status {} at {}:{}", call, static_cast<int>(s), file, line));
}

Stream::Stream() {
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
void Stream::synchronize() const {
  const SyncProbe probe("side stream synchronize", 0);
  MOE_CUDA_CHECK(cudaStreamSynchronize(s_));
}

Event::Event(bool timing) {
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(cudaStream_t s) {
  MOE_CUDA_CHECK(cudaEventRecord(e_, s));
}
void Event::wait_on(cudaStream_t s) const {
  MOE_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0));
}
void Event::synchronize() const {
  const SyncProbe probe("event synchronize", 0);
  MOE_CUDA_CHECK(cudaEventSynchronize(e_));
}
float Event::ms_since(const Event& start) const {
  float ms = 0;
  MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

namespace {
thread_local cudaStream_t t_current = nullptr;
}
cudaStream_t current_stream() {
  return t_current;
}
StreamGuard::StreamGuard(cudaStream_t s) : prev_(t_current) {
  t_current = s;
}
StreamGuard::~StreamGuard() {
  t_current = prev_;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  MOE_CUDA_CHECK(cudaMallocHost(&p_, bytes));
}
PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeHost(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}

}  // namespace moecore::device
