// Stream-ordered caching allocator bookkeeping (see caching_allocator.h).
#include "moecore/device/caching_allocator.h"

#include <fmt/format.h>

#include "moecore/core/error.h"

namespace moecore::device {

CachingAllocator::~CachingAllocator() {
  // Process teardown: the live blocks belong to tensors that may outlive us; only the cache goes back.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, blocks] : free_)
    for (void* p : blocks) backend_.release(p);
  free_.clear();
}

size_t CachingAllocator::round_size(size_t bytes) {
  return Allocator::round_size(bytes < kMinimumBlock ? kMinimumBlock : bytes);
}

void* CachingAllocator::allocate(size_t bytes, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto fail = [&] {
    MOE_CHECK(false,
              "out of {} memory: could not allocate {} bytes ({:.1f} MiB) with {} bytes in use (peak {}); reduce "
              "--micro-batch-size, --seq-length or the model size, or spread it over more GPUs",
              backend_.name, bytes, static_cast<double>(bytes) / 0x1p20, st_.live_bytes, st_.peak_bytes);
  };
  if (bytes > (size_t(1) << 60)) fail();
  const size_t sz = round_size(bytes);
  st_.requests++;
  void* p = nullptr;
  auto it = free_.find({stream, sz});
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    st_.cached_bytes -= static_cast<int64_t>(sz);
  } else {
    p = backend_.allocate(sz);
    if (p == nullptr) {
      release_cached_locked();
      p = backend_.allocate(sz);
    }
    if (p == nullptr) fail();
    st_.system_allocs++;
    st_.system_bytes += static_cast<int64_t>(sz);
  }
  live_[p] = Block{sz, stream};
  st_.live_bytes += static_cast<int64_t>(sz);
  if (st_.live_bytes > st_.peak_bytes) st_.peak_bytes = st_.live_bytes;
  return p;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MOE_ASSERT_MSG(it != live_.end(), "{} block {} freed twice or never allocated here", backend_.name, ptr);
  const Block b = it->second;
  live_.erase(it);
  free_[{b.stream, b.size}].push_back(ptr);
  st_.live_bytes -= static_cast<int64_t>(b.size);
  st_.cached_bytes += static_cast<int64_t>(b.size);
}

void CachingAllocator::release_cached_locked() {
  if (free_.empty()) return;
  if (backend_.synchronize) backend_.synchronize();
  for (auto& [key, blocks] : free_)
    for (void* p : blocks) {
      backend_.release(p);
      st_.system_bytes -= static_cast<int64_t>(key.second);
    }
  free_.clear();
  st_.cached_bytes = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

AllocatorMark CachingAllocator::mark() const {
  std::lock_guard<std::mutex> lock(mu_);
  return AllocatorMark{st_.requests, st_.system_allocs};
}

int64_t CachingAllocator::system_allocs_since(const AllocatorMark& m) const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_.system_allocs - m.system_allocs;
}

int64_t CachingAllocator::requests_since(const AllocatorMark& m) const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_.requests - m.requests;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  st_.peak_bytes = st_.live_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

int64_t CachingAllocator::cached_blocks(uintptr_t stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [key, blocks] : free_)
    if (key.first == stream) n += static_cast<int64_t>(blocks.size());
  return n;
}

}  // namespace moecore::device
