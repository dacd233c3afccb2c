// AMX tile operations behind a tiny policy (configure, zero, load, dot-product, store, release), so that the code
// that blocks and packs for AMX (attention_blocks_bf16.h) runs through the scalar emulation on any CPU and through
// the instructions on CPUs with AMX. Every tile here is 16 rows × 64 bytes (one fixed configuration): callers pad
// their operands to whole tiles. Not a general AMX wrapper.
#pragma once

#include <cstdint>
#include <cstring>

#include "moecore/core/dtype.h"

namespace moecore::kernels::amx {

constexpr int kRows = 16;      // rows of every tile
constexpr int kRowBytes = 64;  // bytes of every tile row: 16 f32, or 32 bf16 (16 pairs)

// True once the CPU has AMX-TILE and AMX-BF16 (cpuid leaf 7: EDX bits 24 and 22), the OS saves the tile state
// (XCR0 bits 17, 18) and the kernel granted this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool usable();  // attention_flash_native.cpp

// Tiles as the instructions do them, one thread's 8 tile registers in thread-local memory. TDPBF16PS semantics:
// C.f32[m][n] += A.bf16[m][2k]·B.bf16[k][2n], then += A.bf16[m][2k+1]·B.bf16[k][2n+1], k ascending; the products
// of two bf16 are exact in f32, each addition rounds to nearest even; bf16 denormal inputs read as zero and denormal
// sums are flushed to zero (AMX-BF16 ignores MXCSR: DAZ, FTZ and RNE always).
struct Emulated {
  struct alignas(64) Tile {
    unsigned char bytes[kRows * kRowBytes];
  };
  static Tile* regs() {
    static thread_local Tile t[8];
    return t;
  }
  static void configure() {}
  static void release() {}
  template <int T>
  static void zero() {
    std::memset(regs()[T].bytes, 0, sizeof(Tile));
  }
  template <int T>
  static void load(const void* p, int64_t stride_bytes) {
    for (int r = 0; r < kRows; r++)
      std::memcpy(regs()[T].bytes + r * kRowBytes, static_cast<const unsigned char*>(p) + r * stride_bytes, kRowBytes);
  }
  template <int T>
  static void store(void* p, int64_t stride_bytes) {
    for (int r = 0; r < kRows; r++)
      std::memcpy(static_cast<unsigned char*>(p) + r * stride_bytes, regs()[T].bytes + r * kRowBytes, kRowBytes);
  }
  template <int C, int A, int B>
  static void dp() {
    float c[kRows][16];
    uint16_t a[kRows][32], b[kRows][32];
    std::memcpy(c, regs()[C].bytes, sizeof c);
    std::memcpy(a, regs()[A].bytes, sizeof a);
    std::memcpy(b, regs()[B].bytes, sizeof b);
    for (int m = 0; m < kRows; m++)
      for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) {
          c[m][n] = ftz(c[m][n] + in(a[m][2 * k]) * in(b[k][2 * n]));
          c[m][n] = ftz(c[m][n] + in(a[m][2 * k + 1]) * in(b[k][2 * n + 1]));
        }
    std::memcpy(regs()[C].bytes, c, sizeof c);
  }

 private:
  static float in(uint16_t bits) {  // DAZ: a denormal bf16 (exponent 0) reads as a zero of its sign
    return bf16_to_float(bf16{static_cast<uint16_t>((bits & 0x7F80u) == 0 ? bits & 0x8000u : bits)});
  }
  static float ftz(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
    std::memcpy(&x, &u, 4);
    return x;
  }
};

// The instructions. Written as inline assembly rather than GCC's _tile_* intrinsics because those paste their tile
// number into the instruction text (a template parameter cannot be one) and their loads do not tell the compiler
// that they read memory; the "i" operands and "memory" clobbers here do both. No target attribute is needed (the
// assembler knows AMX); run only where usable() said yes, and between configure() and release() on one thread.
struct Native {
  struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  };
  static void configure() {
    Config c{};
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = kRowBytes, c.rows[t] = kRows;
    asm volatile("ldtilecfg %0" ::"m"(c));
  }
  static void release() { asm volatile("tilerelease" ::: "memory"); }
  template <int T>
  static void zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int T>
  static void load(const void* p, int64_t stride_bytes) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride_bytes), "i"(T) : "memory");
  }
  template <int T>
  static void store(void* p, int64_t stride_bytes) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride_bytes), "i"(T) : "memory");
  }
  template <int C, int A, int B>
  static void dp() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};

}  // namespace moecore::kernels::amx
