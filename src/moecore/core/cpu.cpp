// CPU helpers (see cpu.h).
#include "moecore/core/cpu.h"

#include <omp.h>

#include <cstdlib>
#include <string>

#include "moecore/core/error.h"

namespace moecore {
int num_threads() {
  return omp_get_max_threads();
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Sse41:
      return "sse41";
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
    case CpuIsa::Avx512Bf16:
      return "avx512bf16";
    case CpuIsa::Amx:
      return "amx";
  }
  return "?";
}

CpuIsa max_cpu_isa() {
  static const CpuIsa cap = [] {
    const char* env = std::getenv("MOECORE_MAX_CPU_ISA");
    if (env == nullptr || *env == '\0') return CpuIsa::Amx;
    for (CpuIsa isa : {CpuIsa::Sse41, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx})
      if (std::string(env) == cpu_isa_name(isa)) return isa;
    MOE_CHECK(false, "MOECORE_MAX_CPU_ISA='{}' is not sse41, avx2, avx512, avx512bf16 or amx", env);
    return CpuIsa::Amx;
  }();
  return cap;
}

CloneLevel clone_level() {
  static const CloneLevel level = [] {
#if MOE_HAVE_CPU_CLONES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4") && cpu_isa_allowed(CpuIsa::Avx512)) return CloneLevel::V4;
    if (__builtin_cpu_supports("x86-64-v3") && cpu_isa_allowed(CpuIsa::Avx2)) return CloneLevel::V3;
#endif
    return CloneLevel::Baseline;
  }();
  return level;
}

const char* clone_level_name(CloneLevel level) {
  switch (level) {
    case CloneLevel::V4:
      return "x86-64-v4";
    case CloneLevel::V3:
      return "x86-64-v3";
    case CloneLevel::Baseline:
      return "baseline";
  }
  return "?";
}
}  // namespace moecore
