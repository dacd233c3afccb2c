// CPU feature helpers. A hot loop is compiled for the x86-64-v4 (AVX-512), x86-64-v3 (AVX2+FMA) and baseline feature
// levels, and each call runs the copy clone_level() names: the CPU's best, no higher than MOECORE_MAX_CPU_ISA allows.
// One binary runs everywhere and uses what the CPU has. The pattern at a hot function f:
//   MOE_ALWAYS_INLINE void f_body(args) { the loop }       inlined into each level's copy, compiled for that level
//   void f(args) { MOE_CPU_CLONES(f_body(args)); }          the original name: callers do not change
// An OpenMP loop in a body is an orphaned `#pragma omp for`, and f opens the team around the dispatch
// (`#pragma omp parallel` then MOE_CPU_CLONES): GCC outlines a parallel region before it inlines, so one inside the
// body would be compiled for the baseline level in every copy. (Levels named after a CPU model,
// arch=skylake-avx512, would miss newer CPUs: never use them.)
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// expr in a lambda per level (GCC takes target attributes on lambdas); the level is read once per call.
// clang-format off
#define MOE_CPU_CLONES(...)                                                                   \
  ([&](::moecore::CloneLevel moe_level_) __attribute__((always_inline)) {                    \
    if (moe_level_ == ::moecore::CloneLevel::V4)                                             \
      return [&]() __attribute__((target("arch=x86-64-v4"))) { return __VA_ARGS__; }();       \
    if (moe_level_ == ::moecore::CloneLevel::V3)                                             \
      return [&]() __attribute__((target("arch=x86-64-v3"))) { return __VA_ARGS__; }();       \
    return __VA_ARGS__;                                                                      \
  }(::moecore::clone_level()))
// clang-format on
#define MOE_HAVE_CPU_CLONES 1
#else
#define MOE_CPU_CLONES(...) (__VA_ARGS__)
#define MOE_HAVE_CPU_CLONES 0  // one baseline build (clang's sanitized build)
#endif

// A function inlined into each level's copy of its caller (so it is compiled for that level): every body.
#define MOE_ALWAYS_INLINE inline __attribute__((always_inline))

namespace moecore {
// Threads an OpenMP region may use.
int num_threads();

// Instruction-set levels, in order; each path moecore chooses at run time asks for one.
enum class CpuIsa { Sse41, Avx2, Avx512, Avx512Bf16, Amx };
const char* cpu_isa_name(CpuIsa isa);

// The highest level moecore's CPU paths may use: every level, or up to the one MOECORE_MAX_CPU_ISA names (sse41,
// avx2, avx512, avx512bf16, amx). It is a test selector: it runs a CPU with more as one with less (CI runs the
// memory-plan and bf16 tests as on an AVX2-only CPU, where bf16 GEMMs widen to f32 and attention has no native bf16
// kernel). It caps oneDNN (dnnl::set_max_cpu_isa, before its first primitive), the native bf16 attention (AMX,
// AVX512-BF16), moecore's explicit AVX-512 forms (Philox lanes, attention block products) and the MOE_CPU_CLONES
// loops (clone_level), whose vector width sets the rounding of their vectorized sums.
CpuIsa max_cpu_isa();
inline bool cpu_isa_allowed(CpuIsa isa) {
  return isa <= max_cpu_isa();
}

// The copy MOE_CPU_CLONES runs, chosen once: x86-64-v4 where the CPU has it (as GCC's target_clones would pick) and
// AVX-512 is allowed, else x86-64-v3 where the CPU has it and AVX2 is allowed, else the baseline (always where there
// are no copies: clang's build).
enum class CloneLevel { Baseline, V3, V4 };
CloneLevel clone_level();
const char* clone_level_name(CloneLevel level);  // "x86-64-v4", "x86-64-v3", "baseline"
}  // namespace moecore
