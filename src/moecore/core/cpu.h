// CPU feature helpers. MOE_TARGET_CLONES compiles a hot loop for AVX-512, AVX2+FMA and baseline x86-64 and picks
// one at load time, so one binary runs everywhere and uses what the CPU has.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOE_TARGET_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define MOE_TARGET_CLONES
#endif

namespace moecore {
// Threads an OpenMP region may use.
int num_threads();
}  // namespace moecore
