// Size-class caching allocator (see allocator.h). One mutex: allocation is per tensor, never per element.
#include "moecore/core/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "moecore/core/error.h"

namespace moecore {

struct Allocator::Impl {
  mutable std::mutex mu;
  std::map<size_t, std::vector<void*>> free_lists;
  AllocatorStats st;
};

Allocator& Allocator::instance() {
  static Allocator a;
  return a;
}

Allocator::Impl& Allocator::impl() const {
  static Impl* p = new Impl();  // never destroyed: tensors may outlive static destruction order
  return *p;
}

// Sizes up to 4 KiB round to 64 bytes; above, to one of 8 steps per power of two, so at most 12.5% is wasted and
// the same shape always lands in the same class.
size_t Allocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= 4096) return (bytes + 63) & ~size_t(63);
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes - 1));  // largest power of two < bytes
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

void* Allocator::allocate(size_t bytes) {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mu);
  // A failed allocation is the user's to fix (model, batch, ranks): an Error with the numbers, never a signal.
  auto out_of_memory = [&] {
    MOE_CHECK(false,
              "out of host memory: could not allocate {} bytes ({}) with {} bytes in use (peak {}); reduce "
              "--micro-batch-size, --seq-length or the model size, or spread it over more ranks",
              bytes,
              bytes >= (size_t(1) << 40) ? fmt::format("{:.3g} TiB", static_cast<double>(bytes) / 0x1p40)
                                         : fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 0x1p20),
              m.st.live_bytes, m.st.peak_bytes);
  };
  if (bytes > (size_t(1) << 60)) out_of_memory();  // no machine has it, and rounding it up would overflow
  const size_t sz = round_size(bytes);
  m.st.requests++;
  void* p = nullptr;
  auto it = m.free_lists.find(sz);
  if (it != m.free_lists.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    m.st.cached_bytes -= static_cast<int64_t>(sz);
  } else {
    p = std::aligned_alloc(64, sz);
    if (p == nullptr) {
      // Give the cache back and try once more before failing.
      for (auto& [s, v] : m.free_lists)
        for (void* q : v) {
          std::free(q);
          m.st.system_bytes -= static_cast<int64_t>(s);
        }
      m.free_lists.clear();
      m.st.cached_bytes = 0;
      p = std::aligned_alloc(64, sz);
    }
    if (p == nullptr) out_of_memory();
    m.st.system_allocs++;
    m.st.system_bytes += static_cast<int64_t>(sz);
  }
  m.st.live_bytes += static_cast<int64_t>(sz);
  if (m.st.live_bytes > m.st.peak_bytes) m.st.peak_bytes = m.st.live_bytes;
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  size_t sz = round_size(bytes);
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mu);
  m.free_lists[sz].push_back(ptr);
  m.st.live_bytes -= static_cast<int64_t>(sz);
  m.st.cached_bytes += static_cast<int64_t>(sz);
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(impl().mu);
  return impl().st;
}

AllocatorMark Allocator::mark() const {
  std::lock_guard<std::mutex> lock(impl().mu);
  return AllocatorMark{impl().st.requests, impl().st.system_allocs};
}

int64_t Allocator::system_allocs_since(const AllocatorMark& mk) const {
  std::lock_guard<std::mutex> lock(impl().mu);
  return impl().st.system_allocs - mk.system_allocs;
}

int64_t Allocator::requests_since(const AllocatorMark& mk) const {
  std::lock_guard<std::mutex> lock(impl().mu);
  return impl().st.requests - mk.requests;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(impl().mu);
  impl().st.peak_bytes = impl().st.live_bytes;
}

void Allocator::empty_cache() {
  Impl& m = impl();
  std::lock_guard<std::mutex> lock(m.mu);
  for (auto& [s, v] : m.free_lists)
    for (void* q : v) {
      std::free(q);
      m.st.system_bytes -= static_cast<int64_t>(s);
    }
  m.free_lists.clear();
  m.st.cached_bytes = 0;
}

}  // namespace moecore
