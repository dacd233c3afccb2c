// CPU feature helpers. MOE_TARGET_CLONES compiles a hot loop for the x86-64-v4 (AVX-512), x86-64-v3 (AVX2+FMA)
// and baseline feature levels and picks one at load time by CPU features, so one binary runs everywhere and uses
// what the CPU has. (Clones named after a CPU model, arch=skylake-avx512, dispatch on the model and miss newer
// CPUs: never use them.)
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOE_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define MOE_HAVE_TARGET_CLONES 1
#else
#define MOE_TARGET_CLONES
#define MOE_HAVE_TARGET_CLONES 0  // one baseline build (clang's sanitized build)
#endif

// A helper inlined into each target clone of its caller (so it is compiled for that clone's instruction set).
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
// AVX512-BF16) and moecore's explicit AVX-512 forms (Philox lanes, attention block products). Not the target clones:
// the loader resolves those from CPUID before any moecore code runs; they change the rounding of vectorized sums,
// never which kernel, buffer or allocation a step takes.
CpuIsa max_cpu_isa();
inline bool cpu_isa_allowed(CpuIsa isa) {
  return isa <= max_cpu_isa();
}
}  // namespace moecore
