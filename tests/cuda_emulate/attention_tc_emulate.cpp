// Host emulation of the tensor-core attention kernels (src/moecore/kernels/cuda/attention_tc_*.cuh), for machines
// without a GPU: every CUDA thread of a block is a fiber (emu_fibers.h), __syncthreads a block barrier, and the
// warp-level primitives (ldmatrix, mma.sync m16n8k16, shfl) exchange their operands through per-warp slots and compute
// what the PTX ISA specifies for each lane. The kernels' own source is compiled unchanged (MOE_TC_EMULATE only swaps
// the four inline-asm/shared-memory primitives), and their results are compared with a naive bf16-rounded reference,
// with attention dropout too (the reference draws Z from dropout_philox.h, whose masks tests/kernels/test_dropout.cpp
// and cuda_kernels_emulate.cpp hold to the CPU kernels' golden masks).
// It checks indexing, masking, tiling, the online softmax and the fragment bookkeeping; not timing, not the real
// hardware's rounding inside an MMA. Built with ASan (out-of-bounds reads and writes) and run by run.sh (CTest
// cuda_attention_tc_host_emulation).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "emu_fibers.h"

#define MOE_TC_EMULATE 1
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace emu {
constexpr int kBlock = 128, kWarps = kBlock / 32;
fibers::Barrier block_bar;
fibers::Barrier warp_bar[kWarps];
unsigned char* smem = nullptr;
size_t smem_size = 0;
struct Slots {
  const void* ptr[32];
  uint32_t a[32][4];
  uint32_t b[32][2];
  float f[32];
};
Slots slots[kWarps];
int lane() {
  return tid.x & 31;
}
int warp() {
  return tid.x >> 5;
}
void sync_warp() {
  fibers::wait(warp_bar[warp()]);
}
void fail(const char* what) {
  std::fprintf(stderr, "emulation check failed: %s\n", what);
  std::abort();
}
uint16_t bits(const __nv_bfloat16* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  return u;
}
float bf(uint32_t reg, int half) {
  const uint16_t u = static_cast<uint16_t>(reg >> (16 * half));
  const uint32_t f = uint32_t(u) << 16;
  float x;
  std::memcpy(&x, &f, 4);
  return x;
}
void check_row(const void* p) {  // an ldmatrix row: 16 bytes, 16-byte aligned, inside the dynamic shared memory
  const auto* c = static_cast<const unsigned char*>(p);
  if (reinterpret_cast<uintptr_t>(p) % 16) fail("ldmatrix row not 16-byte aligned");
  if (c < smem || c + 16 > smem + smem_size) fail("ldmatrix row outside shared memory");
}
}  // namespace emu

#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
inline void __syncthreads() {
  emu::fibers::wait(emu::block_bar);
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  emu::Slots& s = emu::slots[emu::warp()];
  s.f[emu::lane()] = v;
  emu::sync_warp();
  const float r = s.f[emu::lane() ^ m];
  emu::sync_warp();
  return r;
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}

namespace moecore::launch::tc {
inline unsigned char* dyn_smem() {
  return emu::smem;
}
inline void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  emu::check_row(row);
  emu::Slots& s = emu::slots[emu::warp()];
  s.ptr[emu::lane()] = row;
  emu::sync_warp();
  const int g = emu::lane() >> 2, c = emu::lane() & 3;
  for (int j = 0; j < 4; j++) {
    const auto* p = static_cast<const __nv_bfloat16*>(s.ptr[8 * j + g]);
    r[j] = uint32_t(emu::bits(p + 2 * c)) | uint32_t(emu::bits(p + 2 * c + 1)) << 16;
  }
  emu::sync_warp();
}
inline void ldsm_x4_t(uint32_t (&r)[4], const __nv_bfloat16* row) {
  emu::check_row(row);
  emu::Slots& s = emu::slots[emu::warp()];
  s.ptr[emu::lane()] = row;
  emu::sync_warp();
  const int g = emu::lane() >> 2, c = emu::lane() & 3;
  for (int j = 0; j < 4; j++) {
    const auto* p0 = static_cast<const __nv_bfloat16*>(s.ptr[8 * j + 2 * c]);
    const auto* p1 = static_cast<const __nv_bfloat16*>(s.ptr[8 * j + 2 * c + 1]);
    r[j] = uint32_t(emu::bits(p0 + g)) | uint32_t(emu::bits(p1 + g)) << 16;
  }
  emu::sync_warp();
}
inline void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Slots& s = emu::slots[emu::warp()];
  const int l = emu::lane();
  std::memcpy(s.a[l], a, 16);
  s.b[l][0] = b0;
  s.b[l][1] = b1;
  emu::sync_warp();
  const int g = l >> 2, c = l & 3;
  // This lane's rows of A (g, g + 8) and columns of B (2c, 2c + 1), each element decoded once; every output sums
  // its 16 products in k order.
  float av[2][16], bv[2][16];
  for (int h = 0; h < 2; h++)
    for (int k = 0; k < 16; k++) {
      av[h][k] = emu::bf(s.a[4 * g + (k % 8) / 2][h + 2 * (k >= 8)], k % 2);
      bv[h][k] = emu::bf(s.b[4 * (2 * c + h) + (k % 8) / 2][k >= 8], k % 2);
    }
  float out[4];
  for (int e = 0; e < 4; e++) {
    float sum = 0;
    for (int k = 0; k < 16; k++) sum += av[e >> 1][k] * bv[e & 1][k];
    out[e] = acc[e] + sum;
  }
  emu::sync_warp();
  for (int e = 0; e < 4; e++) acc[e] = out[e];
}
}  // namespace moecore::launch::tc

#include "moecore/kernels/cuda/attention_tc_bwd.cuh"
#include "moecore/kernels/cuda/attention_tc_fwd.cuh"

namespace {
using namespace moecore::launch::tc;
using moecore::launch::DropoutParams;

// Runs `kernel` over the grid, one block at a time, kBlock threads per block; shared memory starts as NaN bytes.
void launch(dim3 grid, size_t smem_bytes, const std::function<void()>& kernel) {
  std::vector<unsigned char> buf(smem_bytes + 16);
  unsigned char* base = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) % 16) % 16;
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      std::memset(base, 0xff, smem_bytes);
      emu::smem = base;
      emu::smem_size = smem_bytes;
      emu::block_bar = emu::fibers::Barrier{emu::kBlock};
      for (auto& w : emu::warp_bar) w = emu::fibers::Barrier{32};
      emu::fibers::run_block(emu::kBlock, uint3{bx, by, 0}, kernel);
    }
}

float rb(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

std::vector<float> random(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& e : v) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    e = static_cast<float>(static_cast<double>(z >> 11) / 0x1p53 * 2 - 1);
  }
  return v;
}

double rel(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, mag = 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  return diff / mag;
}

// Δ[b, h, i] = dO·O over the head's D channels, f32 in channel order: the backward kernels' input.
void delta_rows(const std::vector<float>& dout, const std::vector<float>& o, int64_t S, int64_t B, int64_t Nq,
                int64_t D, std::vector<float>& delta) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++)
      for (int64_t i = 0; i < S; i++) {
        float acc = 0;
        for (int64_t d = 0; d < D; d++) acc += dout[((i * B + b) * Nq + h) * D + d] * o[((i * B + b) * Nq + h) * D + d];
        delta[(b * Nq + h) * S + i] = acc;
      }
}

// kDrop: attention dropout at probability p_drop, query and key positions from `offset` (not a multiple of 4: the keep
// bits' unaligned path), query heads from global head 3.
template <int D, bool kDrop = false>
bool run_case(int64_t S, int64_t B, int64_t Nq, int64_t Nkv, double p_drop = 0, int64_t offset = 0) {
  const float scale = 1.0f / std::sqrt(float(D));
  DropoutParams drop;
  const int64_t samples[2] = {41, (int64_t{2} << 32) | 7};
  if (kDrop) {
    drop.on = 1;
    drop.threshold = static_cast<uint32_t>(std::min(4294967295.0, std::round(p_drop * 4294967296.0)));
    drop.keep = static_cast<float>(1.0 / (1.0 - p_drop));
    drop.key = moecore::kernels::dropout_philox::site_key(2024, 0xD0);
    drop.head_offset = 3;
    drop.row_offset = drop.col_offset = offset;
    drop.samples = B;
    for (int64_t b = 0; b < B; b++) drop.sample[b] = samples[b];
  }
  const size_t nq = S * B * Nq * D, nkv = S * B * Nkv * D, nl = B * Nq * S;
  const auto q = random(nq, 1), k = random(nkv, 2), v = random(nkv, 3), dout = random(nq, 4);
  const float nan = std::nanf("");
  std::vector<float> o(nq, nan), lse(nl, nan), dq(nq, nan), dk(nkv, nan), dv(nkv, nan), delta(nl, nan);
  const int64_t G = Nq / Nkv;
  auto qi = [&](int64_t s, int64_t b, int64_t h) { return ((s * B + b) * Nq + h) * D; };
  auto ki = [&](int64_t s, int64_t b, int64_t h) { return ((s * B + b) * Nkv + h) * D; };

  launch(dim3(unsigned(B * Nq), unsigned((S + 63) / 64)), fwd_smem_bytes<D, kDrop>(), [&] {
    fwd_tc_k<D, kDrop>(q.data(), k.data(), v.data(), o.data(), lse.data(), S, S, 0, B, Nq, Nkv, scale, drop);
  });
  delta_rows(dout, o, S, B, Nq, D, delta);
  launch(dim3(unsigned(B * Nkv), unsigned((S + 63) / 64)), dkv_smem_bytes<D, kDrop>(), [&] {
    dkv_tc_k<D, kDrop>(dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dk.data(), dv.data(), S, S,
                       0, B, Nq, Nkv, scale, 1, 0, drop);
  });
  // The group's query heads split over `splits` blocks per key tile (attention_tc_bwd.cu): partial dK/dV per split,
  // added in split order as the launcher's sum_splits_k does.
  std::vector<float> dk_split(nkv, nan), dv_split(nkv, nan);
  const int splits = static_cast<int>(G);
  {
    std::vector<float> pk(splits * nkv, nan), pv(splits * nkv, nan);
    launch(dim3(unsigned(B * Nkv * splits), unsigned((S + 63) / 64)), dkv_smem_bytes<D, kDrop>(), [&] {
      dkv_tc_k<D, kDrop>(dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), pk.data(), pv.data(), S,
                         S, 0, B, Nq, Nkv, scale, splits, int64_t(nkv), drop);
    });
    for (size_t i = 0; i < nkv; i++) {
      float a = pk[i], b = pv[i];
      for (int z = 1; z < splits; z++) a += pk[z * nkv + i], b += pv[z * nkv + i];
      dk_split[i] = a, dv_split[i] = b;
    }
  }
  launch(dim3(unsigned(B * Nq), unsigned((S + 63) / 64)), dq_smem_bytes<D, kDrop>(), [&] {
    dq_tc_k<D, kDrop>(dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dq.data(), S, S, 0, B, Nq,
                      Nkv, scale, 0, drop);
  });

  // Reference: Q̂ = bf16(scale·q), K̂, V̂, dÔ bf16; P ⊙ Z (normalized) and dS rounded to bf16; sums in double.
  std::vector<double> ro(nq, 0), rl(nl, 0), rdq(nq, 0), rdk(nkv, 0), rdv(nkv, 0);
  std::vector<double> p(S), sc(S);
  namespace dp = moecore::kernels::dropout_philox;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++) {
      const int64_t hk = h / G;
      const uint64_t head_key = dp::sub_key(drop.key, uint64_t(drop.head_offset + h));
      auto z = [&](int64_t i, int64_t j) {  // the multiplier of (i, j)
        if (!kDrop) return 1.0;
        const uint64_t col = uint64_t(offset + j);
        const bool kept =
            (dp::keep_nibble(head_key, drop.threshold, uint64_t(samples[b]), uint64_t(offset + i), col / 4) >>
             (col % 4)) &
            1u;
        return kept ? double(drop.keep) : 0.0;
      };
      for (int64_t i = 0; i < S; i++) {
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += double(rb(q[qi(i, b, h) + d] * scale)) * rb(k[ki(j, b, hk) + d]);
          sc[j] = s;
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; j++) sum += p[j] = std::exp(sc[j] - mx);
        rl[(b * Nq + h) * S + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; j++)
          for (int d = 0; d < D; d++)
            ro[qi(i, b, h) + d] += double(rb(float(p[j] / sum * z(i, j)))) * rb(v[ki(j, b, hk) + d]);
        double dl = 0;
        for (int d = 0; d < D; d++) dl += double(dout[qi(i, b, h) + d]) * o[qi(i, b, h) + d];
        for (int64_t j = 0; j <= i; j++) {
          const double pj = std::exp(sc[j] - rl[(b * Nq + h) * S + i]);
          double dp = 0;
          for (int d = 0; d < D; d++) dp += double(rb(dout[qi(i, b, h) + d])) * rb(v[ki(j, b, hk) + d]);
          const double zj = z(i, j), ds = rb(float(pj * (dp * zj - dl)));
          for (int d = 0; d < D; d++) {
            rdq[qi(i, b, h) + d] += scale * ds * rb(k[ki(j, b, hk) + d]);
            rdk[ki(j, b, hk) + d] += ds * rb(q[qi(i, b, h) + d] * scale);
            rdv[ki(j, b, hk) + d] += double(rb(float(pj * zj))) * rb(dout[qi(i, b, h) + d]);
          }
        }
      }
    }
  const double eo = rel(o, ro), el = rel(lse, rl), eq = rel(dq, rdq), ek = rel(dk, rdk), ev = rel(dv, rdv);
  const double esk = rel(dk_split, rdk), esv = rel(dv_split, rdv);
  bool ok = eo < 2e-2 && el < 2e-2 && eq < 2e-2 && ek < 2e-2 && ev < 2e-2 && esk < 2e-2 && esv < 2e-2;
  double changed = 0;
  if (kDrop) {  // the reference without dropout is far from the kernel's output: the test sees the mask
    std::vector<double> plain(nq, 0);
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < Nq; h++)
        for (int64_t i = 0; i < S; i++) {
          const double l = rl[(b * Nq + h) * S + i];
          for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int d = 0; d < D; d++) s += double(rb(q[qi(i, b, h) + d] * scale)) * rb(k[ki(j, b, h / G) + d]);
            for (int d = 0; d < D; d++) plain[qi(i, b, h) + d] += std::exp(s - l) * rb(v[ki(j, b, h / G) + d]);
          }
        }
    changed = rel(o, plain);
    ok &= changed > 5e-2;
  }
  std::printf(
      "%s S=%lld B=%lld Nq=%lld Nkv=%lld D=%d%s: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e; %d splits: dk %.2e dv "
      "%.2e%s\n",
      ok ? "ok  " : "FAIL", (long long)S, (long long)B, (long long)Nq, (long long)Nkv, D,
      kDrop ? (offset % 4 ? " dropout (unaligned keys)" : " dropout") : "", eo, el, eq, ek, ev, splits, esk, esv,
      kDrop ? (changed > 5e-2 ? "; o moved by the mask" : "; DROPOUT CHANGED NOTHING") : "");
  return ok;
}

// A block of context parallelism (launch_attention_tc.h AttentionSpan): Sq query rows at global positions q0.. against
// Sk keys at k0.. (key visible when its position is at or before the row's), dq accumulated onto its prior contents,
// rows that see no key o 0 and lse −inf. The reference is the bf16-rounded one above restricted to the visible keys,
// with the dropout mask of the global positions (base + q0 + i, base + k0 + j), as the CPU's block form draws it.
template <int D, bool kDrop = false>
bool run_block_case(int64_t Sq, int64_t Sk, int64_t q0, int64_t k0, int64_t B, int64_t Nq, int64_t Nkv,
                    double p_drop = 0, int64_t base = 0) {
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t off = q0 - k0, G = Nq / Nkv;
  DropoutParams drop;
  const int64_t samples[2] = {5, (int64_t{1} << 32) | 9};
  if (kDrop) {
    drop.on = 1;
    drop.threshold = static_cast<uint32_t>(std::round(p_drop * 4294967296.0));
    drop.keep = static_cast<float>(1.0 / (1.0 - p_drop));
    drop.key = moecore::kernels::dropout_philox::site_key(77, 0xA7);
    drop.head_offset = 1;
    drop.row_offset = base + q0;
    drop.col_offset = base + k0;
    drop.samples = B;
    for (int64_t b = 0; b < B; b++) drop.sample[b] = samples[b];
  }
  const size_t nq = Sq * B * Nq * D, nkv = Sk * B * Nkv * D, nl = B * Nq * Sq;
  const auto q = random(nq, 11), k = random(nkv, 12), v = random(nkv, 13), dout = random(nq, 14), dq0 = random(nq, 15);
  auto qi = [&](int64_t s, int64_t b, int64_t h) { return ((s * B + b) * Nq + h) * D; };
  auto ki = [&](int64_t s, int64_t b, int64_t h) { return ((s * B + b) * Nkv + h) * D; };
  auto seen = [&](int64_t i, int64_t j) { return j <= i + off; };
  namespace dp = moecore::kernels::dropout_philox;
  auto z = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    if (!kDrop) return 1.0;
    const uint64_t key = dp::sub_key(drop.key, uint64_t(drop.head_offset + h)), col = uint64_t(base + k0 + j);
    return (dp::keep_nibble(key, drop.threshold, uint64_t(samples[b]), uint64_t(base + q0 + i), col / 4) >> (col % 4)) &
                   1u
               ? double(drop.keep)
               : 0.0;
  };
  // Reference forward.
  std::vector<double> ro(nq, 0), rl(nl, -INFINITY), sc(Sk);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++)
      for (int64_t i = 0; i < Sq; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < Sk && seen(i, j); j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += double(rb(q[qi(i, b, h) + d] * scale)) * rb(k[ki(j, b, h / G) + d]);
          sc[j] = s;
          mx = std::max(mx, s);
        }
        if (mx == -INFINITY) continue;
        for (int64_t j = 0; j < Sk && seen(i, j); j++) sum += std::exp(sc[j] - mx);
        rl[(b * Nq + h) * Sq + i] = mx + std::log(sum);
        for (int64_t j = 0; j < Sk && seen(i, j); j++)
          for (int d = 0; d < D; d++)
            ro[qi(i, b, h) + d] +=
                double(rb(float(std::exp(sc[j] - mx) / sum * z(b, h, i, j)))) * rb(v[ki(j, b, h / G) + d]);
      }
  const float nan = std::nanf("");
  std::vector<float> o(nq, nan), lse(nl, nan), dq = dq0, dk(nkv, nan), dv(nkv, nan), delta(nl, nan);
  launch(dim3(unsigned(B * Nq), unsigned((Sq + 63) / 64)), fwd_smem_bytes<D, kDrop>(), [&] {
    fwd_tc_k<D, kDrop>(q.data(), k.data(), v.data(), o.data(), lse.data(), Sq, Sk, off, B, Nq, Nkv, scale, drop);
  });
  // Backward against a final (o, lse): this block's own, as when it is the row's only block.
  std::vector<float> lse_f(nl);
  for (size_t x = 0; x < nl; x++) lse_f[x] = std::isfinite(lse[x]) ? lse[x] : 0.0f;  // rows with no key: any finite
  delta_rows(dout, o, Sq, B, Nq, D, delta);
  launch(dim3(unsigned(B * Nkv), unsigned((Sk + 63) / 64)), dkv_smem_bytes<D, kDrop>(), [&] {
    dkv_tc_k<D, kDrop>(dout.data(), q.data(), k.data(), v.data(), lse_f.data(), delta.data(), dk.data(), dv.data(), Sq,
                       Sk, off, B, Nq, Nkv, scale, 1, 0, drop);
  });
  launch(dim3(unsigned(B * Nq), unsigned((Sq + 63) / 64)), dq_smem_bytes<D, kDrop>(), [&] {
    dq_tc_k<D, kDrop>(dout.data(), q.data(), k.data(), v.data(), lse_f.data(), delta.data(), dq.data(), Sq, Sk, off, B,
                      Nq, Nkv, scale, 1, drop);
  });
  std::vector<double> rdq(dq0.begin(), dq0.end()), rdk(nkv, 0), rdv(nkv, 0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++)
      for (int64_t i = 0; i < Sq; i++) {
        const double l = lse_f[(b * Nq + h) * Sq + i], dl = delta[(b * Nq + h) * Sq + i];
        for (int64_t j = 0; j < Sk && seen(i, j); j++) {
          double s = 0, dpv = 0;
          for (int d = 0; d < D; d++) {
            s += double(rb(q[qi(i, b, h) + d] * scale)) * rb(k[ki(j, b, h / G) + d]);
            dpv += double(rb(dout[qi(i, b, h) + d])) * rb(v[ki(j, b, h / G) + d]);
          }
          const double pj = std::exp(s - l), zj = z(b, h, i, j), ds = rb(float(pj * (dpv * zj - dl)));
          for (int d = 0; d < D; d++) {
            rdq[qi(i, b, h) + d] += scale * ds * rb(k[ki(j, b, h / G) + d]);
            rdk[ki(j, b, h / G) + d] += ds * rb(q[qi(i, b, h) + d] * scale);
            rdv[ki(j, b, h / G) + d] += double(rb(float(pj * zj))) * rb(dout[qi(i, b, h) + d]);
          }
        }
      }
  bool lse_ok = true;  // −inf exactly where a row sees no key
  for (size_t x = 0; x < nl; x++) lse_ok &= (rl[x] == -INFINITY) == (lse[x] == -INFINITY);
  std::vector<float> lse_cmp(nl);
  std::vector<double> rl_cmp(nl);
  for (size_t x = 0; x < nl; x++) {
    lse_cmp[x] = std::isfinite(lse[x]) ? lse[x] : 0.0f;
    rl_cmp[x] = std::isfinite(rl[x]) ? rl[x] : 0.0;
  }
  const double eo = rel(o, ro), el = rel(lse_cmp, rl_cmp), eq = rel(dq, rdq), ek = rel(dk, rdk), ev = rel(dv, rdv);
  const bool ok = lse_ok && eo < 2e-2 && el < 2e-2 && eq < 2e-2 && ek < 2e-2 && ev < 2e-2;
  std::printf(
      "%s block Sq=%lld@%lld Sk=%lld@%lld B=%lld Nq=%lld Nkv=%lld D=%d%s: o %.2e lse %.2e%s dq(+=) %.2e dk %.2e "
      "dv %.2e\n",
      ok ? "ok  " : "FAIL", (long long)Sq, (long long)q0, (long long)Sk, (long long)k0, (long long)B, (long long)Nq,
      (long long)Nkv, D, kDrop ? " dropout" : "", eo, el, lse_ok ? "" : " (-inf rows WRONG)", eq, ek, ev);
  return ok;
}
}  // namespace

int main() {
  bool ok = true;
  ok &= run_case<64>(1, 1, 1, 1);
  ok &= run_case<64>(17, 2, 2, 1);
  ok &= run_case<128>(70, 1, 2, 2);
  ok &= run_case<64>(130, 1, 4, 2);
  ok &= run_case<128>(200, 2, 2, 1);
  ok &= run_case<64>(65, 2, 4, 2);
  ok &= run_case<128>(129, 1, 3, 1);
  ok &= run_case<64>(150, 1, 8, 1);  // one sequence, 8 query heads per kv head (the Qwen3-MoE benchmark's GQA)
  // Attention dropout: the forward's P ⊙ Z, the backward's regenerated Z in both kernels (and the head splits).
  ok &= run_case<64, true>(130, 2, 4, 2, 0.1);
  ok &= run_case<128, true>(70, 1, 2, 1, 0.3, 3);
  ok &= run_case<64, true>(100, 1, 8, 1, 0.5, 64);
  // Context parallelism's blocks: a whole chunk below the diagonal, a later chunk's diagonal, keys partly past the
  // rows (rows that see no key), unaligned positions; with dropout keyed by global positions.
  ok &= run_block_case<64>(64, 64, 128, 0, 1, 2, 1);
  ok &= run_block_case<64>(70, 90, 30, 50, 1, 2, 2);
  ok &= run_block_case<128>(33, 100, 90, 3, 1, 2, 1);
  ok &= run_block_case<64, true>(50, 70, 65, 1, 2, 2, 1, 0.2, 6);
  ok &= run_block_case<128, true>(40, 40, 40, 40, 1, 1, 1, 0.3, 10);
  std::printf(ok ? "all cases pass\n" : "FAILURES\n");
  return ok ? 0 : 1;
}
