// Offload copies on their own stream (see offload_copy.h). Events are pooled: a released ticket's event is recorded
// again by a later record, so a steady-state step creates none.
#include <vector>

#include "moecore/core/error.h"
#include "moecore/device/check.h"
#include "moecore/device/offload_copy.h"
#include "moecore/device/stream.h"

namespace moecore::device {

void* pinned_allocate(size_t bytes) {
  void* p = nullptr;
  MOE_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  return p;
}

void pinned_free(void* p) {
  if (p) cudaFreeHost(p);
}

struct OffloadCopyStream::Impl {
  Stream copies;
  Event forked;
  std::vector<std::unique_ptr<Event>> events;  // indexed by ticket
  std::vector<int64_t> free;                   // tickets released
};

OffloadCopyStream::OffloadCopyStream() : impl_(std::make_unique<Impl>()) {}

OffloadCopyStream::~OffloadCopyStream() {
  if (impl_) cudaStreamSynchronize(impl_->copies.get());  // no copy may outlive its pinned buffer
}

void OffloadCopyStream::wait_for_current() {
  impl_->forked.record(current_stream());
  impl_->forked.wait_on(impl_->copies.get());
}

void OffloadCopyStream::copy(void* dst, const void* src, size_t bytes) {
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, impl_->copies.get()));
}

int64_t OffloadCopyStream::record() {
  int64_t t = 0;
  if (!impl_->free.empty()) {
    t = impl_->free.back();
    impl_->free.pop_back();
  } else {
    t = static_cast<int64_t>(impl_->events.size());
    impl_->events.push_back(std::make_unique<Event>());
  }
  impl_->events[static_cast<size_t>(t)]->record(impl_->copies.get());
  return t;
}

void OffloadCopyStream::current_waits(int64_t t) {
  MOE_ASSERT(t >= 0 && t < static_cast<int64_t>(impl_->events.size()));
  impl_->events[static_cast<size_t>(t)]->wait_on(current_stream());
}

void OffloadCopyStream::release(int64_t t) {
  impl_->free.push_back(t);
}

void OffloadCopyStream::synchronize() {
  impl_->copies.synchronize();
}

}  // namespace moecore::device
