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
}  // namespace moecore
