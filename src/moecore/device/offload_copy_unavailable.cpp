// Offload copies (offload_copy.h) in a CPU-only build: no GPU tensor exists to offload, and every call throws.
#include "moecore/core/error.h"
#include "moecore/device/offload_copy.h"

namespace moecore::device {

namespace {
[[noreturn]] void no_offload_copies() {
  throw Error(
      "GPU activation offloading: this moecore was built without CUDA (rebuild with -DMOECORE_CUDA=ON, or use "
      "--device cpu)");
}
}  // namespace

void* pinned_allocate(size_t) {
  no_offload_copies();
}
void pinned_free(void* p) {
  (void)p;
}

struct OffloadCopyStream::Impl {};
OffloadCopyStream::OffloadCopyStream() {
  no_offload_copies();
}
OffloadCopyStream::~OffloadCopyStream() = default;
void OffloadCopyStream::wait_for_current() {}
void OffloadCopyStream::copy(void*, const void*, size_t) {}
int64_t OffloadCopyStream::record() {
  return 0;
}
void OffloadCopyStream::current_waits(int64_t) {}
void OffloadCopyStream::release(int64_t) {}
void OffloadCopyStream::synchronize() {}

}  // namespace moecore::device
