// Copies between a GPU and pinned host memory on a stream of their own, ordered against the calling thread's current
// stream by events (no host synchronisation): what activation offloading (train/activation_offload.h) needs from the
// CUDA runtime. Plain host declarations, no CUDA headers; a CPU-only build throws "built without CUDA" on first use.
// Not a general stream API (stream.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace moecore::device {

// Page-locked host memory (cudaMallocHost), for copies that overlap compute.
void* pinned_allocate(size_t bytes);
void pinned_free(void* p);

class OffloadCopyStream {
 public:
  OffloadCopyStream();  // a non-blocking stream on the current device
  ~OffloadCopyStream();
  OffloadCopyStream(const OffloadCopyStream&) = delete;
  OffloadCopyStream& operator=(const OffloadCopyStream&) = delete;

  // The copy stream waits for everything queued on the current stream so far.
  void wait_for_current();
  // `bytes` from src to dst on the copy stream (one side pinned host memory, the other the GPU).
  void copy(void* dst, const void* src, size_t bytes);
  // A marker after the copies queued so far: a ticket for current_waits, then give back with release.
  int64_t record();
  // The current stream waits for the copies before ticket t (no host block).
  void current_waits(int64_t t);
  void release(int64_t t);
  // The host waits for every copy queued (teardown).
  void synchronize();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecore::device
