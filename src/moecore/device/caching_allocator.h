// The bookkeeping of the GPU's stream-ordered caching allocator, independent of the CUDA runtime: it gets memory
// from a RawBackend (cudaMalloc/cudaFree on a GPU; a fake in the CPU unit tests) and never touches it.
//
// Stream-ordered: a freed block goes to the free list of the stream it was allocated on, and only allocations on
// that stream take it again, so work queued on the stream before the free finishes before the new owner's work
// starts (no synchronisation). Sizes round to the CPU allocator's classes (Allocator::round_size: 64 B up to 4 KiB,
// then 8 steps per power of two), with a 512-byte minimum. Every block is its own raw allocation (cudaMalloc: 256-byte
// aligned); blocks are not split. When the backend fails, every cached block of every stream is released (after the
// backend's synchronise) and the allocation tried once more; then an Error says how much is live and the peak.
// Statistics are the CPU allocator's (AllocatorStats, marks). One mutex: allocation is per tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "moecore/core/allocator.h"

namespace moecore::device {

struct RawBackend {
  std::function<void*(size_t)> allocate;  // nullptr when out of memory
  std::function<void(void*)> release;
  std::function<void()> synchronize;  // waits for all streams before cached blocks are released
  std::string name = "GPU";           // in the out-of-memory message
};

class CachingAllocator {
 public:
  explicit CachingAllocator(RawBackend backend) : backend_(std::move(backend)) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static constexpr size_t kMinimumBlock = 512;  // the smallest block handed out
  static size_t round_size(size_t bytes);

  void* allocate(size_t bytes, uintptr_t stream);
  void deallocate(void* ptr);

  AllocatorStats stats() const;
  AllocatorMark mark() const;
  int64_t system_allocs_since(const AllocatorMark& m) const;
  int64_t requests_since(const AllocatorMark& m) const;
  void reset_peak();
  // Releases every cached block (after the backend's synchronise).
  void empty_cache();
  // Cached blocks on one stream's free lists (for tests).
  int64_t cached_blocks(uintptr_t stream) const;

 private:
  struct Block {
    size_t size;
    uintptr_t stream;
  };
  void release_cached_locked();
  RawBackend backend_;
  mutable std::mutex mu_;
  std::map<std::pair<uintptr_t, size_t>, std::vector<void*>> free_;  // (stream, size class) -> blocks
  std::unordered_map<void*, Block> live_;
  AllocatorStats st_;
};

}  // namespace moecore::device
