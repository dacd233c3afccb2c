// A second GPU stream for work that may run beside the current stream's (Megatron's --moe-shared-expert-overlap:
// the shared experts beside the routed experts). fork() orders the side stream after everything queued on the
// current stream so far and makes it current; end() makes the previous stream current again; join() makes the
// current stream wait for the side stream's work. Only the order of independent work changes, never a result.
// On the CPU, or when off, all three do nothing.
//
// Memory: the caching allocator keeps a free list per stream. A block freed after end() was last used by side
// work that every later region waits for (each fork() waits for the current stream, which waited in join()), and a
// block the current stream frees is reused by the side stream only after the next fork(): no block is reused while
// another stream may still read it.
#pragma once

#include <memory>

#include "moecore/core/device.h"

namespace moecore::device {

class SideStream {
 public:
  explicit SideStream(bool on);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  void fork(Device d);  // the side stream is current until end(); nothing unless on and d is a GPU
  void end();
  void join();  // the current stream waits for the side stream's work since fork()
  bool active(Device d) const { return on_ && d.is_cuda(); }

 private:
  struct Impl;
  bool on_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecore::device
