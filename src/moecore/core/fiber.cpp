// Fiber (see fiber.h): ucontext's makecontext/swapcontext over an mmap'ed stack (untouched pages cost nothing).
#include "moecore/core/fiber.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdint>
#include <utility>

#include "moecore/core/error.h"

namespace moecore {

struct Fiber::Context {
  ucontext_t self{}, caller{};
  void* stack = nullptr;
  size_t bytes = 0;
};

namespace {
thread_local Fiber* t_running_fiber = nullptr;
}

Fiber::Fiber(std::function<void()> fn, size_t stack_bytes) : fn_(std::move(fn)), ctx_(std::make_unique<Context>()) {
  ctx_->bytes = stack_bytes;
  ctx_->stack = mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  MOE_ASSERT(ctx_->stack != MAP_FAILED);
  MOE_ASSERT(getcontext(&ctx_->self) == 0);
  ctx_->self.uc_stack.ss_sp = ctx_->stack;
  ctx_->self.uc_stack.ss_size = stack_bytes;
  ctx_->self.uc_link = &ctx_->caller;  // returning from entry goes back to the last resumer
  const auto p = reinterpret_cast<uintptr_t>(this);
  makecontext(&ctx_->self, reinterpret_cast<void (*)()>(&Fiber::entry), 2, static_cast<unsigned>(p & 0xffffffffu),
              static_cast<unsigned>(p >> 32));
}

Fiber::~Fiber() {
  // A fiber left suspended (its resumer unwound by an exception) keeps objects on its stack that can never be
  // destroyed: the stack is left mapped rather than freed under them.
  if (done_ || !started_) munmap(ctx_->stack, ctx_->bytes);
}

void Fiber::entry(unsigned lo, unsigned hi) {
  auto* f = reinterpret_cast<Fiber*>(static_cast<uintptr_t>(lo) | (static_cast<uintptr_t>(hi) << 32));
  try {
    f->fn_();
  } catch (...) {
    f->error_ = std::current_exception();
  }
  f->done_ = true;
  t_running_fiber = nullptr;
}

void Fiber::resume() {
  MOE_ASSERT(!done_ && t_running_fiber == nullptr);  // no nesting: resumed from the thread's own stack
  started_ = true;
  t_running_fiber = this;
  MOE_ASSERT(swapcontext(&ctx_->caller, &ctx_->self) == 0);
  t_running_fiber = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void Fiber::yield() {
  Fiber* f = t_running_fiber;
  if (!f) return;
  t_running_fiber = nullptr;
  MOE_ASSERT(swapcontext(&f->ctx_->self, &f->ctx_->caller) == 0);
  t_running_fiber = f;
}

Fiber* Fiber::current() {
  return t_running_fiber;
}

}  // namespace moecore
