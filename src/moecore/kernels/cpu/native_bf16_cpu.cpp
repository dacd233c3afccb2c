// Which native bf16 instructions this CPU runs for the flash attention kernel (attention_flash_native.h): CPUID and
// the OS's saved state for AVX512-BF16, and for AMX also the kernel's permission to use tile data and a check of one
// tile product against its emulation. Both stay within max_cpu_isa() (core/cpu.h).
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/amx_tiles.h"
#include "moecore/kernels/cpu/attention_flash_native.h"

namespace moecore::kernels {

namespace {

uint64_t cpu_xcr0() {
  uint32_t eax, edx;
  asm volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

bool cpu_osxsave() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27));
}

bool cpu_avx512_bf16() {
  unsigned a, b, c, d;
  if (!cpu_isa_allowed(CpuIsa::Avx512Bf16)) return false;
  if (!cpu_osxsave() || (cpu_xcr0() & 0xE6) != 0xE6) return false;  // SSE, AVX, opmask and both ZMM halves saved
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool f_bw_vl = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));
  if (!f_bw_vl || a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return a & (1u << 5);  // leaf 7 subleaf 1 EAX bit 5: AVX512_BF16
}

bool cpu_amx() {
  unsigned a, b, c, d;
  if (!cpu_isa_allowed(CpuIsa::Amx)) return false;
  if (!cpu_osxsave() || (cpu_xcr0() & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// One tile product through the instructions against the emulation (small integers: exact in any order, so the two
// must agree bit for bit). The AMX path was written on CPUs without AMX; should the instructions ever disagree on a
// CPU that has them, bf16 attention falls back to AVX512-BF16 and says so once, instead of training on wrong sums.
bool tiles_agree_with_emulation() {
  alignas(64) uint16_t a[amx::kRows][32], b[amx::kRows][32];
  alignas(64) float native[amx::kRows][16], emulated[amx::kRows][16];
  for (int r = 0; r < amx::kRows; r++)
    for (int j = 0; j < 32; j++) {
      a[r][j] = float_to_bf16(static_cast<float>((r * 7 + j * 3) % 7 - 3)).bits;
      b[r][j] = float_to_bf16(static_cast<float>((r * 5 + j) % 5 - 2)).bits;
    }
  auto run = [&](auto tiles, float(*c)[16]) {
    using Tiles = decltype(tiles);
    Tiles::configure();
    Tiles::template zero<0>();
    Tiles::template load<1>(a, 64);
    Tiles::template load<2>(b, 64);
    Tiles::template dp<0, 1, 2>();
    Tiles::template store<0>(c, 64);
    Tiles::release();
  };
  run(amx::Native{}, native);
  run(amx::Emulated{}, emulated);
  if (std::memcmp(native, emulated, sizeof native) == 0) return true;
  std::fprintf(stderr,
               "moecore: warning: this CPU's AMX tile products disagree with their emulation; bf16 attention uses "
               "AVX512-BF16 instead (please report the CPU model)\n");
  return false;
}

}  // namespace

namespace amx {
bool usable() {
  static const bool ok = cpu_amx() && tiles_agree_with_emulation();
  return ok;
}
}  // namespace amx

namespace flash {

const char* native_bf16_name(NativeBf16 b) {
  switch (b) {
    case NativeBf16::Avx512Bf16:
      return "AVX512-BF16";
    case NativeBf16::AmxEmulated:
      return "AMX (emulated)";
    case NativeBf16::Amx:
      return "AMX";
  }
  return "?";
}

bool native_bf16_supported(NativeBf16 b) {
  static const bool avx512 = cpu_avx512_bf16();
  switch (b) {
    case NativeBf16::Avx512Bf16:
      return avx512;
    case NativeBf16::AmxEmulated:
      return true;
    case NativeBf16::Amx:
      return amx::usable();
  }
  return false;
}

bool has_native_bf16() {
  return native_bf16_supported(NativeBf16::Amx) || native_bf16_supported(NativeBf16::Avx512Bf16);
}

NativeBf16 best_native_bf16() {
  MOE_ASSERT_MSG(has_native_bf16(), "this CPU has neither AMX nor AVX512-BF16");
  // MOECORE_NATIVE_BF16: auto (AMX where the CPU has it), amx or avx512bf16. The two give different bits (their pair
  // sums run in different orders), both within bf16 rounding; the override is for measuring one against the other.
  static const NativeBf16 chosen = [] {
    const char* env = std::getenv("MOECORE_NATIVE_BF16");
    const std::string m = env == nullptr || *env == '\0' ? "auto" : env;
    MOE_CHECK(m == "auto" || m == "amx" || m == "avx512bf16", "MOECORE_NATIVE_BF16='{}' is not auto, amx or avx512bf16",
              m);
    const NativeBf16 b = m == "amx"                               ? NativeBf16::Amx
                         : m == "avx512bf16"                      ? NativeBf16::Avx512Bf16
                         : native_bf16_supported(NativeBf16::Amx) ? NativeBf16::Amx
                                                                  : NativeBf16::Avx512Bf16;
    MOE_CHECK(native_bf16_supported(b), "MOECORE_NATIVE_BF16={}: this CPU does not run {}; use auto", m,
              native_bf16_name(b));
    return b;
  }();
  return chosen;
}

}  // namespace flash
}  // namespace moecore::kernels
