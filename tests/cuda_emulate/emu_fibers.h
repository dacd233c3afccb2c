// The CUDA threads of one emulated block as fibers on the calling OS thread (the host-emulation harnesses include it
// through emu_cuda.h or attention_tc_emulate.cpp): a fiber runs until it reaches a barrier (__syncthreads, a warp
// primitive's exchange) or the end of the kernel, then hands over to the next fiber that can run. Not a general
// scheduler: one block at a time, no preemption, and a barrier that can never complete aborts with a message instead of
// hanging. Kernels without data races give the same results under any interleaving, so the order fibers run in is
// free; it is fixed here (the next index after the current one, wrapping), which keeps every run identical.
// Stacks are mmap'd once (with a guard page below each) and reused by every block of every launch. The switch is a
// few instructions of assembly on x86-64 (swapcontext makes a system call per switch for the signal mask, and ASan's
// interceptor clears the whole new stack's shadow) and ucontext elsewhere. Under AddressSanitizer each switch is
// announced with __sanitizer_start/finish_switch_fiber, so ASan knows which stack is live.
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_FIBERS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_FIBERS_ASAN 1
#endif
#endif
#ifdef EMU_FIBERS_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
// emu_fiber_switch(save, to): pushes the callee-saved registers and the SSE/x87 control words on the current stack,
// stores the stack pointer in *save, loads `to` and pops the same from there. A fresh stack holds a frame shaped like
// these pushes whose return address is the fiber's entry. Weak, so a second translation unit including this header
// links.
extern "C" void emu_fiber_switch(void** save, void* to);
asm(R"(
  .pushsection .text
  .weak emu_fiber_switch
  .type emu_fiber_switch, @function
emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_fiber_switch, .-emu_fiber_switch
  .popsection
)");
#endif

namespace emu {
inline uint3 tid, bid;  // the running fiber's threadIdx and blockIdx (set at every switch)

namespace fibers {
// A barrier among `expected` fibers: the last to arrive completes it (gen moves on) and keeps running; the others
// wait until gen has moved.
struct Barrier {
  unsigned expected = 0, arrived = 0, gen = 0;
};

constexpr size_t kStackBytes = size_t(256) << 10;  // ASan's redzones make kernel frames several times larger
constexpr size_t kGuardBytes = 4096;

struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
  void* asan_fake = nullptr;  // ASan's fake stack of this context while it is switched out
};

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // usable bytes [stack, stack + kStackBytes)
  uint3 tid{};
  const Barrier* waiting = nullptr;  // the barrier this fiber waits at, or none
  unsigned waiting_gen = 0;
  bool done = true;
};

struct State {
  // Grows to the largest block seen and never shrinks; each Fiber stays where it is, because suspended fibers hold
  // references to their own.
  std::vector<std::unique_ptr<Fiber>> fibers;
  unsigned count = 0;  // fibers in the current block
  int current = -1;    // index of the running fiber, -1 for the launching thread
  Context main;
  const void* main_stack = nullptr;  // the launching thread's stack as ASan reports it
  size_t main_stack_size = 0;
  const std::function<void()>* body = nullptr;
};
inline State state;

inline void fail(const char* what) {
  std::fprintf(stderr, "FAIL: fiber emulation: %s\n", what);
  std::abort();
}

// Leaves the context `from` for `to`, whose stack is [bottom, bottom + size), and returns when something switches back.
inline void switch_context(Context& from, Context& to, const void* bottom, size_t size) {
#ifdef EMU_FIBERS_ASAN
  __sanitizer_start_switch_fiber(&from.asan_fake, bottom, size);
#else
  (void)bottom;
  (void)size;
#endif
#if defined(__x86_64__)
  emu_fiber_switch(&from.sp, to.sp);
#else
  if (swapcontext(&from.uc, &to.uc) != 0) fail("swapcontext");
#endif
#ifdef EMU_FIBERS_ASAN
  const void* old_bottom;
  size_t old_size;
  __sanitizer_finish_switch_fiber(from.asan_fake, &old_bottom, &old_size);
#endif
}

inline bool runnable(const Fiber& f) {
  return !f.done && (f.waiting == nullptr || f.waiting->gen != f.waiting_gen);
}

// Hands the OS thread from the running fiber to the next runnable one (in index order, wrapping), or to the launching
// thread when every fiber has finished the block.
inline void yield() {
  State& s = state;
  const unsigned from = static_cast<unsigned>(s.current);
  unsigned next = from;
  for (unsigned k = 1; k <= s.count; k++) {
    const unsigned i = (from + k) % s.count;
    if (runnable(*s.fibers[i])) {
      next = i;
      break;
    }
  }
  Fiber& f = *s.fibers[from];
  if (next == from && !runnable(f)) {
    for (unsigned i = 0; i < s.count; i++)
      if (!s.fibers[i]->done)
        fail("a barrier no fiber can complete (a thread skipped __syncthreads or a warp primitive)");
    s.current = -1;
    switch_context(f.ctx, s.main, s.main_stack, s.main_stack_size);
  } else if (next != from) {
    Fiber& n = *s.fibers[next];
    s.current = static_cast<int>(next);
    tid = n.tid;
    switch_context(f.ctx, n.ctx, n.stack, kStackBytes);
  }
  tid = s.fibers[static_cast<unsigned>(s.current)]->tid;
}

inline void wait(Barrier& b) {
  const unsigned gen = b.gen;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    b.gen++;
    return;
  }
  Fiber& f = *state.fibers[static_cast<unsigned>(state.current)];
  f.waiting = &b;
  f.waiting_gen = gen;
  while (f.waiting->gen == gen) yield();
  f.waiting = nullptr;
}

// Every fiber's life: run the block's body, mark itself done, hand over; the next block resumes it at the top.
[[noreturn]] inline void entry() {
#ifdef EMU_FIBERS_ASAN
  // Fiber 0 is always first entered from the launching thread, so its first switch tells that thread's stack.
  const void* from_bottom;
  size_t from_size;
  __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
  if (state.current == 0) {
    state.main_stack = from_bottom;
    state.main_stack_size = from_size;
  }
#endif
  for (;;) {
    (*state.body)();
    state.fibers[static_cast<unsigned>(state.current)]->done = true;
    yield();
  }
}

#if !defined(__x86_64__)
inline void entry_c() {
  entry();
}
#endif

inline void make_fiber(Fiber& f) {
  void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fail("mmap of a fiber stack");
  if (mprotect(m, kGuardBytes, PROT_NONE) != 0) fail("mprotect of a stack guard page");
  f.stack = static_cast<char*>(m) + kGuardBytes;
#if defined(__x86_64__)
  // The frame emu_fiber_switch pops: control words, r15..rbp, return address = entry, then an empty slot where a
  // call would have left entry's own return address (so entry starts with the stack aligned as the ABI wants).
  auto* top = reinterpret_cast<uint64_t*>(f.stack + kStackBytes);
  uint64_t* sp = top - 9;
  unsigned mxcsr;
  unsigned short fpcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  sp[0] = mxcsr | uint64_t(fpcw) << 32;
  for (int r = 1; r <= 6; r++) sp[r] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&entry);
  sp[8] = 0;
  f.ctx.sp = sp;
#else
  if (getcontext(&f.ctx.uc) != 0) fail("getcontext");
  f.ctx.uc.uc_stack.ss_sp = f.stack;
  f.ctx.uc.uc_stack.ss_size = kStackBytes;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, entry_c, 0);
#endif
}

// Runs `body` once per thread of a block of `n` threads, block index `block`, all on the calling thread; returns when
// every thread has finished. Barriers the body waits at must be (re)armed by the caller for this block.
inline void run_block(unsigned n, uint3 block, const std::function<void()>& body) {
  State& s = state;
  if (s.current != -1) fail("a launch from inside a kernel");
  if (n == 0) return;
  while (s.fibers.size() < n) {
    s.fibers.push_back(std::make_unique<Fiber>());
    make_fiber(*s.fibers.back());
  }
  s.count = n;
  s.body = &body;
  for (unsigned t = 0; t < n; t++) {
    Fiber& f = *s.fibers[t];
    f.tid = uint3{t, 0, 0};
    f.waiting = nullptr;
    f.done = false;
  }
  bid = block;
  tid = s.fibers[0]->tid;
  s.current = 0;
  switch_context(s.main, s.fibers[0]->ctx, s.fibers[0]->stack, kStackBytes);
  for (unsigned t = 0; t < n; t++)
    if (!s.fibers[t]->done) fail("the launching thread resumed before the block finished");
}
}  // namespace fibers
}  // namespace emu
