// The caching host allocator every Tensor draws from. Freed blocks go back to a free list keyed by their rounded
// size and are handed out again, so a steady-state training step (same shapes as the step before) takes no memory
// from the system. Statistics let a test prove it. Not for small objects: blocks are 64-byte aligned and rounded.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moecore {

struct AllocatorStats {
  int64_t live_bytes = 0;     // bytes handed out and not yet freed (rounded sizes)
  int64_t peak_bytes = 0;     // max of live_bytes since the last reset_peak()
  int64_t cached_bytes = 0;   // bytes held in free lists
  int64_t requests = 0;       // allocate() calls, ever
  int64_t system_allocs = 0;  // allocate() calls that had to go to the system (cache misses), ever
  int64_t system_bytes = 0;   // bytes obtained from the system and not returned
};

// A point to measure from: "how many system allocations since the mark".
struct AllocatorMark {
  int64_t requests = 0;
  int64_t system_allocs = 0;
};

class Allocator {
 public:
  static Allocator& instance();

  void* allocate(size_t bytes);
  void deallocate(void* ptr, size_t bytes);

  AllocatorStats stats() const;
  AllocatorMark mark() const;
  int64_t system_allocs_since(const AllocatorMark& m) const;
  int64_t requests_since(const AllocatorMark& m) const;
  void reset_peak();
  // Returns every cached block to the system.
  void empty_cache();

  // The size class a request of `bytes` is served from.
  static size_t round_size(size_t bytes);

 private:
  Allocator() = default;
  struct Impl;
  Impl& impl() const;
};

}  // namespace moecore
