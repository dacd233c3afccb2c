// A stackful coroutine on the calling thread (POSIX ucontext): resume() runs its function until it calls
// Fiber::yield() or returns; yield() goes back to whoever resumed it. Everything stays on one OS thread, so MPI's
// FUNNELED level, OpenMP's per-thread settings and thread_local state are those of the caller. Used by the combined
// 1F1B schedule (train/pipeline/combined_1f1b.h) to run one micro-batch's forward between the sub-steps of
// another's backward. Not a scheduler: the caller decides when to resume.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

namespace moecore {

class Fiber {
 public:
  explicit Fiber(std::function<void()> fn, size_t stack_bytes = size_t{64} << 20);
  ~Fiber();  // frees the stack unless the fiber is suspended mid-function
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  // Runs the function until it yields or ends; an exception it threw is rethrown here.
  void resume();
  bool done() const { return done_; }
  // From inside a fiber: back to the resumer. Outside any fiber: nothing.
  static void yield();
  // The fiber running now (null: the thread's own stack).
  static Fiber* current();

 private:
  struct Context;
  static void entry(unsigned lo, unsigned hi);
  std::function<void()> fn_;
  std::unique_ptr<Context> ctx_;
  bool done_ = false, started_ = false;
  std::exception_ptr error_;
};

}  // namespace moecore
