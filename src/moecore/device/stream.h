// Streams, events and pinned host buffers (CUDA builds only). Every kernel launch and stream-ordered allocation
// goes to the calling thread's current stream: the default (legacy) stream unless a StreamGuard says otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace moecore::device {

class Stream {
 public:
  Stream();  // a new non-blocking stream on the current device
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s);
  void wait_on(cudaStream_t s) const;  // s waits for this event (no host block)
  void synchronize() const;
  float ms_since(const Event& start) const;  // both recorded with timing=true
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// The calling thread's current stream (nullptr = the legacy default stream).
cudaStream_t current_stream();

// Makes `s` the current stream of this thread for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t prev_;
};

// Page-locked host memory for asynchronous copies (host staging of MPI traffic, batches to the GPU).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace moecore::device
