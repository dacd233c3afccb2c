// Host emulation of the CUDA kernels that have no tensor cores (col_reduce.cu, norm_bias.cu, elementwise.cu,
// embedding_bwd.cu, dropout.cu, attention.cu's warp-per-row attention and its blocks at global positions,
// attention_merge.cu), for machines without a GPU: blocks run one at a
// time, each CUDA thread a fiber, __syncthreads a block barrier, __shfl_xor_sync an exchange through per-warp
// slots, __shared__ a static (one block at a time). The kernels' own source is compiled after cuda_kernels_emulate.py
// rewrites their launches; results are checked against f64 host references (1e-5), the embedding backward bitwise
// against the CPU kernel's order; dropout's masks bitwise against the CPU kernels' golden masks
// (tests/kernels/dropout_golden.h), and the warp-per-row attention with dropout against an f64 reference drawing the
// same mask. It checks indexing, chunking, masking and the reduction trees; not timing. Built and run by run.sh (CTest
// cuda_kernels_host_emulation).
#include "emu_cuda.h"
#include "kernels/dropout_golden.h"
#include "moecore/kernels/cuda/attention_dropout.cuh"
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_attention_tc.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"
#include "moecore/kernels/cuda/launch_dropout.h"
#include "moecore/kernels/dropout_philox.h"
// attention.cu picks the tensor-core kernels (attention_tc_emulate.cpp emulates those) only for bf16 with D 64/128;
// the cases here stay on the warp-per-row kernels.
namespace moecore::launch {
bool attention_tc_supported(int64_t, int64_t, int64_t, int64_t, bool) {
  return false;
}
void attention_tc_forward(const float*, const float*, const float*, float*, float*, const AttentionSpan&, int64_t,
                          int64_t, int64_t, int64_t, float, const DropoutParams&, cudaStream_t) {
  std::abort();
}
void attention_tc_backward(const float*, const float*, const float*, const float*, const float*, const float*, float*,
                           float*, float*, float*, const AttentionSpan&, int64_t, int64_t, int64_t, int64_t, float,
                           const DropoutParams&, cudaStream_t) {
  std::abort();
}
}  // namespace moecore::launch

// The kernels, rewritten by cuda_kernels_emulate.py (after the shims above and the headers they use).
#include "cuda_kernels_emulate.inc"

using namespace moecore::launch;
using emu::rnd;
double relerr(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < b.size(); i++) {
    if (!std::isfinite(a[i])) return 1e9;
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}
// The mask of (seed, site, p) as the CPU's DropoutMask::make keys it (kernels/cpu/dropout.cpp), for `samples`.
DropoutParams dropout_params(uint64_t seed, uint64_t site, double p, int64_t B, const int64_t* samples) {
  DropoutParams d;
  d.on = 1;
  d.threshold = static_cast<uint32_t>(std::min(4294967295.0, std::round(p * 4294967296.0)));
  d.keep = static_cast<float>(1.0 / (1.0 - p));
  d.key = moecore::kernels::dropout_philox::site_key(seed, site);
  d.samples = B;
  for (int64_t b = 0; b < B; b++) d.sample[b] = samples[b];
  return d;
}

// Hidden dropout: the kernel draws the golden masks, kept elements times exactly keep (in place too).
bool check_hidden_dropout() {
  namespace golden = moecore::testing::dropout_golden;
  bool ok = true;
  for (const golden::HiddenCase& c : golden::kHidden) {
    DropoutParams d = dropout_params(c.seed, c.site, c.p, c.B, c.sample);
    d.row_offset = c.seq_offset;
    const long rows = c.S * c.B, n = rows * c.C;
    std::vector<float> ones(n, 1.0f), y(n, NAN);
    dropout_apply(ones.data(), y.data(), rows, c.C, d, nullptr);
    uint64_t h = golden::kFnvStart;
    long kept = 0;
    bool values = true;
    for (long i = 0; i < n; i++) {
      h = golden::fnv_add(h, y[i] != 0.0f);
      kept += y[i] != 0.0f;
      values &= y[i] == 0.0f || y[i] == d.keep;
    }
    auto x = rnd(n, 21), z = x;
    dropout_apply(z.data(), z.data(), rows, c.C, d, nullptr);  // in place
    for (long i = 0; i < n; i++) values &= z[i] == x[i] * (y[i] != 0.0f ? d.keep : 0.0f);
    const bool same = h == c.hash && kept == c.kept && values;
    std::printf("dropout p=%.2f S=%ld B=%ld C=%ld offset=%ld: %s (hash %016llx, %ld kept)\n", c.p, long(c.S), long(c.B),
                long(c.C), long(c.seq_offset), same ? "the CPU's mask, bitwise ok" : "DIFFERS", (unsigned long long)h,
                kept);
    ok &= same;
  }
  return ok;
}

// The attention dropout helpers of the device code draw the golden masks: HeadMask::kept (warp-per-row kernels),
// RowMask's walk, and tile_keep_bits (the tensor-core kernels' shared-memory bits, one block of 128 threads).
bool check_attention_masks() {
  namespace golden = moecore::testing::dropout_golden;
  bool ok = true;
  for (const golden::AttentionCase& c : golden::kAttention) {
    DropoutParams d = dropout_params(c.seed, c.site, c.p, c.B, c.sample);
    d.head_offset = c.head_offset;
    d.row_offset = c.seq_offset;
    d.col_offset = c.key_offset < 0 ? c.seq_offset : c.key_offset;
    const long S = c.S, tiles = (S + 63) / 64;
    std::vector<uint8_t> tile_mask(c.B * c.Nq * S * S);
    std::vector<uint64_t> bits(64);
    emu::launch(dim3(1), dim3(128), [&] {
      for (long b = 0; b < c.B; b++)
        for (long hd = 0; hd < c.Nq; hd++)
          for (long it = 0; it < tiles; it++)
            for (long jt = 0; jt < tiles; jt++) {
              tile_keep_bits<64, 128>(bits.data(), d, HeadMask(d, b, hd), it * 64, jt * 64);
              __syncthreads();
              if (threadIdx.x == 0)
                for (long i = it * 64; i < std::min(S, it * 64 + 64); i++)
                  for (long j = jt * 64; j < std::min(S, jt * 64 + 64); j++)
                    tile_mask[((b * c.Nq + hd) * S + i) * S + j] = (bits[i - it * 64] >> (j - jt * 64)) & 1;
              __syncthreads();
            }
    });
    uint64_t h_tile = golden::kFnvStart, h_kept = golden::kFnvStart, h_walk = golden::kFnvStart;
    long kept = 0;
    for (long b = 0; b < c.B; b++)
      for (long hd = 0; hd < c.Nq; hd++) {
        const HeadMask m(d, b, hd);
        for (long i = 0; i < S; i++) {
          RowMask walk{m, uint64_t(d.row_offset + i), uint64_t(d.col_offset)};
          for (long j = 0; j < S; j++) {
            const bool k = m.kept(d.row_offset + i, d.col_offset + j);
            kept += k;
            h_kept = golden::fnv_add(h_kept, k);
            h_walk = golden::fnv_add(h_walk, walk.kept(j));
            h_tile = golden::fnv_add(h_tile, tile_mask[((b * c.Nq + hd) * S + i) * S + j]);
          }
        }
      }
    const bool same = h_tile == c.hash && h_kept == c.hash && h_walk == c.hash && kept == c.kept;
    std::printf("attention dropout p=%.2f B=%ld Nq=%ld S=%ld offsets %ld/%ld/%ld: %s\n", c.p, long(c.B), long(c.Nq), S,
                long(c.head_offset), long(c.seq_offset), long(c.key_offset),
                same ? "the CPU's mask (tiles, rows, walks), bitwise ok" : "DIFFERS");
    ok &= same;
  }
  return ok;
}

// The shape of an attention reference: Sq query rows against Sk keys, row i seeing keys j <= i + off.
struct AttentionShape {
  long Sq, Sk, off, B, Nq, Nkv, D;
  float scale;
  bool rnd_bf16;  // the GEMM operands rounded to bf16 (the scale folded into q first), as the bf16 kernels do
};

// The f64 reference of the definition (kernels/attention.h): O = (P ⊙ Z)·V with lse of the undropped softmax,
// dV = (P ⊙ Z)ᵀ·dO, dS = P ⊙ (Z ⊙ dP − Δ) with Δ = dO·O from the kernel's own o; z(b, h, i, j) the dropout
// multiplier. The gradients are added to o, dq, dk and dv as they stand (dq may start from a prior block's); rows that
// see no key are left alone.
struct AttentionReference {
  std::vector<double> o, lse, dq, dk, dv;
  AttentionReference(long nq, long nkv, long nl) : o(nq, 0), lse(nl, -INFINITY), dq(nq, 0), dk(nkv, 0), dv(nkv, 0) {}
  template <typename Z>
  void run(const AttentionShape& a, const std::vector<float>& q, const std::vector<float>& k,
           const std::vector<float>& v, const std::vector<float>& dout, const std::vector<float>& o_kernel, Z z_of) {
    const long B = a.B, Nq = a.Nq, Nkv = a.Nkv, D = a.D, G = Nq / Nkv;
    const float scale = a.scale;
    auto r = [&](float x) { return a.rnd_bf16 ? double(__bfloat162float(__float2bfloat16_rn(x))) : double(x); };
    auto qi = [&](long s, long b, long h) { return ((s * B + b) * Nq + h) * D; };
    auto ki = [&](long s, long b, long h) { return ((s * B + b) * Nkv + h) * D; };
    std::vector<double> pr(a.Sk), z(a.Sk);
    for (long b = 0; b < B; b++)
      for (long h = 0; h < Nq; h++)
        for (long i = 0; i < a.Sq; i++) {
          const long jend = std::clamp(i + a.off + 1, 0L, a.Sk);
          if (jend == 0) continue;
          double mx = -INFINITY, sum = 0;
          for (long j = 0; j < jend; j++) {
            double sc = 0;
            for (long e = 0; e < D; e++)
              sc += r(q[qi(i, b, h) + e] * (a.rnd_bf16 ? scale : 1.0f)) * r(k[ki(j, b, h / G) + e]);
            pr[j] = a.rnd_bf16 ? sc : sc * scale;
            mx = std::max(mx, pr[j]);
            z[j] = z_of(b, h, i, j);
          }
          for (long j = 0; j < jend; j++) sum += pr[j] = std::exp(pr[j] - mx);
          lse[(b * Nq + h) * a.Sq + i] = mx + std::log(sum);
          double dl = 0;
          for (long e = 0; e < D; e++) dl += double(dout[qi(i, b, h) + e]) * o_kernel[qi(i, b, h) + e];
          for (long j = 0; j < jend; j++) {
            const double pj = pr[j] / sum;
            double dp = 0;
            for (long e = 0; e < D; e++) dp += r(dout[qi(i, b, h) + e]) * r(v[ki(j, b, h / G) + e]);
            const double ds = pj * (dp * z[j] - dl);
            for (long e = 0; e < D; e++) {
              o[qi(i, b, h) + e] += pj * z[j] * r(v[ki(j, b, h / G) + e]);
              dv[ki(j, b, h / G) + e] += pj * z[j] * r(dout[qi(i, b, h) + e]);
              dq[qi(i, b, h) + e] += scale * ds * r(k[ki(j, b, h / G) + e]);
              dk[ki(j, b, h / G) + e] +=
                  ds * r(q[qi(i, b, h) + e] * (a.rnd_bf16 ? scale : 1.0f)) * (a.rnd_bf16 ? 1 : scale);
            }
          }
        }
  }
};

// The warp-per-row attention (f32, and bf16-rounded) with dropout against an f64 reference of the definition
// (kernels/attention.h): O = (P ⊙ Z)·V, dV = (P ⊙ Z)ᵀ·dO, dS = P ⊙ (Z ⊙ dP − Δ), Z from dropout_philox directly; and
// far from the same kernel without dropout.
double attention_rowwise_case(long S, long B, long Nq, long Nkv, long D, double p, bool rnd_bf16, long offset) {
  const int64_t samples[2] = {17, (int64_t{3} << 32) | 5};
  DropoutParams d = dropout_params(99, 0x1234, p, B, samples);
  d.head_offset = 1;
  d.row_offset = d.col_offset = offset;
  const float scale = 1.0f / std::sqrt(float(D));
  const long nq = S * B * Nq * D, nkv = S * B * Nkv * D, nl = B * Nq * S;
  auto q = rnd(nq, 31), k = rnd(nkv, 32), v = rnd(nkv, 33), dout = rnd(nq, 34);
  std::vector<float> o(nq, NAN), lse(nl, NAN), dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN), delta(nl, NAN), o0(nq, NAN);
  attention_rowwise_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), S, B, Nq, Nkv, D, scale, rnd_bf16, d,
                            nullptr);
  attention_rowwise_backward(dout.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), dq.data(), dk.data(),
                             dv.data(), delta.data(), S, B, Nq, Nkv, D, scale, rnd_bf16, d, nullptr);
  attention_rowwise_forward(q.data(), k.data(), v.data(), o0.data(), lse.data(), S, B, Nq, Nkv, D, scale, rnd_bf16,
                            DropoutParams{}, nullptr);
  AttentionReference ref(nq, nkv, nl);
  ref.run(
      AttentionShape{S, S, 0, B, Nq, Nkv, D, scale, rnd_bf16}, q, k, v, dout, o,
      [&](long b, long h, long i, long j) { return HeadMask(d, b, h).kept(offset + i, offset + j) ? d.keep : 0.0; });
  const std::vector<double>&ro = ref.o, &rdq = ref.dq, &rdk = ref.dk, &rdv = ref.dv;
  std::vector<double> o0d(o0.begin(), o0.end());
  const double changed = relerr(o, o0d);
  const double e = std::max({relerr(o, ro), relerr(dq, rdq), relerr(dk, rdk), relerr(dv, rdv)});
  return changed > 5e-2 ? e : 1e9;  // dropout must change the output
}

// A block of context parallelism on the warp-per-row kernels (launch_attention_tc.h AttentionSpan): Sq query rows at
// global positions q0.. against Sk keys at k0.., with dropout keyed by the global positions (base + q0 + i,
// base + k0 + j) as the CPU's block form draws it, dq accumulated onto its prior contents, against an f64 reference
// (rows that see no key: o 0, lse −inf). Then the split of the same keys into two blocks merged by attention_merge.cu
// against the one block (the online softmax across blocks).
double attention_block_case(long Sq, long Sk, long q0, long k0, long B, long Nq, long Nkv, long D, double p,
                            bool rnd_bf16, long base, double* merge_err) {
  const int64_t samples[2] = {3, (int64_t{7} << 32) | 2};
  DropoutParams d = p > 0 ? dropout_params(5, 0x77, p, B, samples) : DropoutParams{};
  if (p > 0) {
    d.head_offset = 2;
    d.row_offset = base + q0;
    d.col_offset = base + k0;
  }
  const long off = q0 - k0;
  const float scale = 1.0f / std::sqrt(float(D));
  const long nq = Sq * B * Nq * D, nkv = Sk * B * Nkv * D, nl = B * Nq * Sq;
  auto q = rnd(nq, 41), k = rnd(nkv, 42), v = rnd(nkv, 43), dout = rnd(nq, 44), dq0 = rnd(nq, 45);
  std::vector<float> o(nq, NAN), lse(nl, NAN), dq = dq0, dk(nkv, NAN), dv(nkv, NAN), delta(nl, NAN);
  const AttentionSpan sp{Sq, Sk, off, 1};
  attention_rowwise_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), sp, B, Nq, Nkv, D, scale, rnd_bf16, d,
                            nullptr);
  // The backward against this block's own (o, lse); rows that see no key get a finite lse (they have no term).
  std::vector<float> lse_f(lse);
  for (auto& x : lse_f)
    if (!std::isfinite(x)) x = 0;
  attention_rowwise_backward(dout.data(), q.data(), k.data(), v.data(), o.data(), lse_f.data(), dq.data(), dk.data(),
                             dv.data(), delta.data(), sp, B, Nq, Nkv, D, scale, rnd_bf16, d, nullptr);
  AttentionReference ref(nq, nkv, nl);
  ref.dq.assign(dq0.begin(), dq0.end());
  ref.run(AttentionShape{Sq, Sk, off, B, Nq, Nkv, D, scale, rnd_bf16}, q, k, v, dout, o,
          [&](long b, long h, long i, long j) {
            return p == 0 ? 1.0 : HeadMask(d, b, h).kept(base + q0 + i, base + k0 + j) ? d.keep : 0.0;
          });
  const std::vector<double>&ro = ref.o, &rl = ref.lse, &rdq = ref.dq, &rdk = ref.dk, &rdv = ref.dv;
  // Rows that see no key: o 0 and lse −inf exactly.
  bool empty_rows_ok = true;
  for (long b = 0; b < B; b++)
    for (long h = 0; h < Nq; h++)
      for (long i = 0; i < Sq && i + off + 1 <= 0; i++) {
        empty_rows_ok &= lse[(b * Nq + h) * Sq + i] == -INFINITY;
        for (long e = 0; e < D; e++) empty_rows_ok &= o[((i * B + b) * Nq + h) * D + e] == 0.0f;
      }
  std::vector<float> lse_c(nl);
  std::vector<double> rl_c(nl);
  for (long x = 0; x < nl; x++) {
    lse_c[x] = std::isfinite(lse[x]) ? lse[x] : 0;
    rl_c[x] = std::isfinite(rl[x]) ? rl[x] : 0;
  }
  // The keys in two blocks [0, ks) and [ks, Sk), merged: the one block's (o, lse).
  const long ks = Sk / 3;
  std::vector<float> o1(nq, NAN), l1(nl, NAN), o2(nq, NAN), l2(nl, NAN);
  std::vector<float> k1(k.begin(), k.begin() + ks * B * Nkv * D), v1(v.begin(), v.begin() + ks * B * Nkv * D);
  std::vector<float> k2(k.begin() + ks * B * Nkv * D, k.end()), v2(v.begin() + ks * B * Nkv * D, v.end());
  DropoutParams d2 = d;
  d2.col_offset += ks;
  attention_rowwise_forward(q.data(), k1.data(), v1.data(), o1.data(), l1.data(), AttentionSpan{Sq, ks, off, 0}, B, Nq,
                            Nkv, D, scale, rnd_bf16, d, nullptr);
  attention_rowwise_forward(q.data(), k2.data(), v2.data(), o2.data(), l2.data(),
                            AttentionSpan{Sq, Sk - ks, off - ks, 0}, B, Nq, Nkv, D, scale, rnd_bf16, d2, nullptr);
  attention_merge(o1.data(), l1.data(), o2.data(), l2.data(), Sq, B * Nq, D, nullptr);
  std::vector<double> od(o.begin(), o.end()), ld(lse_c.begin(), lse_c.end());
  for (auto& x : l1)
    if (!std::isfinite(x)) x = 0;
  *merge_err = std::max(relerr(o1, od), relerr(l1, ld));
  if (!empty_rows_ok) return 1e9;
  return std::max({relerr(o, ro), relerr(lse_c, rl_c), relerr(dq, rdq), relerr(dk, rdk), relerr(dv, rdv)});
}

// attention_merge.cu against the CPU block form's f32 formula, rows with either side −inf included.
double attention_merge_case() {
  const long S = 9, BN = 5, D = 7;
  auto o = rnd(S * BN * D, 51), op = rnd(S * BN * D, 52), l = rnd(S * BN, 53, -3, 3), lp = rnd(S * BN, 54, -3, 3);
  l[3] = -INFINITY;
  lp[7] = -INFINITY;
  l[11] = lp[11] = -INFINITY;
  std::vector<double> ro(o.begin(), o.end()), rl(l.begin(), l.end());
  for (long s = 0; s < S; s++)
    for (long bn = 0; bn < BN; bn++) {
      const double l1 = l[bn * S + s], l2 = lp[bn * S + s];
      if (l2 == -INFINITY) continue;
      const long row = (s * BN + bn) * D;
      if (l1 == -INFINITY) {
        for (long e = 0; e < D; e++) ro[row + e] = op[row + e];
        rl[bn * S + s] = l2;
        continue;
      }
      const double mx = std::max(l1, l2), w1 = std::exp(l1 - mx), w2 = std::exp(l2 - mx);
      for (long e = 0; e < D; e++) ro[row + e] = (w1 * o[row + e] + w2 * op[row + e]) / (w1 + w2);
      rl[bn * S + s] = mx + std::log(w1 + w2);
    }
  attention_merge(o.data(), l.data(), op.data(), lp.data(), S, BN, D, nullptr);
  for (auto* x : {&l, &lp})
    for (auto& e : *x)
      if (!std::isfinite(e)) e = 0;
  for (auto& e : rl)
    if (!std::isfinite(e)) e = 0;
  return std::max(relerr(o, ro), relerr(l, rl));
}

int main() {
  bool ok = true;
  auto check = [&](const char* what, double e, double tol) {
    std::printf("%-50s %.2e %s\n", what, e, e < tol ? "ok" : "FAIL");
    ok &= e < tol;
  };
  ok &= check_hidden_dropout();
  ok &= check_attention_masks();
  check("rowwise attention dropout f32 S=37 B=2 4/2 D=24", attention_rowwise_case(37, 2, 4, 2, 24, 0.2, false, 0),
        1e-5);
  check("rowwise attention dropout f32 S=70 B=1 2/2 D=40 off 5", attention_rowwise_case(70, 1, 2, 2, 40, 0.5, false, 5),
        1e-5);
  check("rowwise attention dropout bf16 S=33 B=2 2/1 D=32", attention_rowwise_case(33, 2, 2, 1, 32, 0.1, true, 0),
        2e-2);
  check("attention merge (rows with -inf sides)", attention_merge_case(), 1e-6);
  {
    struct BlockCase {
      const char* name;
      long Sq, Sk, q0, k0, B, Nq, Nkv, D;
      double p;
      bool bf16;
      long base;
    };
    const BlockCase cases[] = {
        {"block f32 chunk below the diagonal", 20, 20, 40, 0, 2, 2, 1, 24, 0, false, 0},
        {"block f32 diagonal chunk, dropout", 24, 24, 48, 48, 1, 4, 2, 16, 0.3, false, 7},
        {"block f32 keys past the rows (empty rows), dropout", 30, 45, 10, 25, 2, 2, 2, 20, 0.2, false, 3},
        {"block f32 prefix of keys (allgather), dropout", 16, 48, 32, 0, 1, 2, 1, 40, 0.1, false, 0},
        {"block bf16 unaligned, dropout", 21, 37, 50, 19, 2, 2, 1, 32, 0.1, true, 5},
    };
    for (const BlockCase& c : cases) {
      double merge = 1e9;
      char buf[120];
      const double e = attention_block_case(c.Sq, c.Sk, c.q0, c.k0, c.B, c.Nq, c.Nkv, c.D, c.p, c.bf16, c.base, &merge);
      std::snprintf(buf, sizeof buf, "%s", c.name);
      check(buf, e, c.bf16 ? 2e-2 : 1e-5);
      std::snprintf(buf, sizeof buf, "  two blocks merged = one (%s)", c.bf16 ? "bf16" : "f32");
      check(buf, merge, c.bf16 ? 2e-2 : 1e-5);
    }
  }
  for (auto [rows, N] : std::vector<std::pair<long, long>>{{1, 7}, {3, 70}, {600, 33}, {1000, 64}, {257, 5}}) {
    auto dy = rnd(rows * N, 1), x = rnd(rows * N, 2), mean = rnd(rows, 3), rstd = rnd(rows, 4, 0.5, 1.5),
         w0 = rnd(N, 5), b0 = rnd(N, 6);
    std::vector<float> scratch(col_reduce_scratch_floats(rows, N, 2) + 1, NAN);
    std::vector<double> rb(N), rw(N), rl(N), rlb(N);
    for (long j = 0; j < N; j++) {
      rb[j] = b0[j];
      rw[j] = w0[j];
      rl[j] = w0[j];
      rlb[j] = b0[j];
    }
    for (long t = 0; t < rows; t++)
      for (long j = 0; j < N; j++) {
        const double g = dy[t * N + j];
        rb[j] += g;
        rw[j] += g * x[t * N + j] * rstd[t];
        rl[j] += g * (x[t * N + j] - mean[t]) * rstd[t];
        rlb[j] += g;
      }
    auto db = b0;
    col_sums_two_stage(dy.data(), db.data(), scratch.data(), rows, N, nullptr);
    char buf[100];
    snprintf(buf, 100, "col sums %ldx%ld", rows, N);
    check(buf, relerr(db, rb), 1e-5);
    auto dw = w0;
    rmsnorm_dw_two_stage(dy.data(), x.data(), rstd.data(), dw.data(), scratch.data(), rows, N, nullptr);
    snprintf(buf, 100, "rms dw %ldx%ld", rows, N);
    check(buf, relerr(dw, rw), 1e-5);
    auto lw = w0, lb = b0;
    layernorm_dwb_two_stage(dy.data(), x.data(), mean.data(), rstd.data(), lw.data(), lb.data(), scratch.data(), rows,
                            N, nullptr);
    snprintf(buf, 100, "ln dw/db %ldx%ld", rows, N);
    check(buf, std::max(relerr(lw, rl), relerr(lb, rlb)), 1e-5);
    auto sq = b0;
    col_sums_sequential(dy.data(), sq.data(), rows, N, nullptr);
    snprintf(buf, 100, "sequential col sums %ldx%ld", rows, N);
    check(buf, relerr(sq, rb), 1e-5);
  }
  // Norm rows: warp and block kernels, with an overflowing row.
  for (long H : {7L, 40L, 1024L, 1030L}) {
    const long T = 11;
    auto x = rnd(T * H, 7), w = rnd(H, 8), b = rnd(H, 9), dy = rnd(T * H, 10);
    for (long j = 0; j < H; j++) x[2 * H + j] *= 1e30f;
    std::vector<double> ry(T * H), rly(T * H), rdx(T * H), rldx(T * H);
    std::vector<float> rr(T), mm(T), lr(T);
    for (long t = 0; t < T; t++) {
      double ss = 0, s = 0;
      for (long j = 0; j < H; j++) {
        ss += double(x[t * H + j]) * x[t * H + j];
        s += x[t * H + j];
      }
      const double r = 1.0 / std::sqrt(ss / H + 1e-6);
      rr[t] = r;
      for (long j = 0; j < H; j++) ry[t * H + j] = x[t * H + j] * r * w[j];
      const double mu = s / H;
      double v = 0;
      for (long j = 0; j < H; j++) v += (x[t * H + j] - mu) * (x[t * H + j] - mu);
      const double lrs = 1.0 / std::sqrt(v / H + 1e-6);
      mm[t] = mu;
      lr[t] = lrs;
      for (long j = 0; j < H; j++) rly[t * H + j] = (x[t * H + j] - mu) * lrs * w[j] + b[j];
    }
    std::vector<float> y(T * H, NAN), r(T, NAN), ly(T * H, NAN), m(T, NAN), l(T, NAN);
    rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), T, H, 1e-6f, nullptr);
    layernorm_forward(x.data(), w.data(), b.data(), ly.data(), m.data(), l.data(), T, H, 1e-6f, nullptr);
    char buf[100];
    snprintf(buf, 100, "rms fwd H=%ld", H);
    check(buf, relerr(y, ry), 1e-5);
    snprintf(buf, 100, "ln fwd H=%ld", H);
    check(buf, relerr(ly, rly), 1e-5);
    // dx on ordinary rows with the reference statistics
    auto xs = rnd(T * H, 11);
    std::vector<float> rs(T), ms(T), ls(T);
    for (long t = 0; t < T; t++) {
      double ss = 0, s = 0;
      for (long j = 0; j < H; j++) {
        ss += double(xs[t * H + j]) * xs[t * H + j];
        s += xs[t * H + j];
      }
      rs[t] = 1.0 / std::sqrt(ss / H + 1e-6);
      const double mu = s / H;
      double v = 0;
      for (long j = 0; j < H; j++) v += (xs[t * H + j] - mu) * (xs[t * H + j] - mu);
      ms[t] = mu;
      ls[t] = 1.0 / std::sqrt(v / H + 1e-6);
    }
    for (long t = 0; t < T; t++) {
      double c = 0, sg = 0, sgx = 0;
      for (long j = 0; j < H; j++) {
        c += double(w[j]) * dy[t * H + j] * xs[t * H + j];
        const double g = double(w[j]) * dy[t * H + j];
        sg += g;
        sgx += g * (xs[t * H + j] - ms[t]) * ls[t];
      }
      const double k = double(rs[t]) * rs[t] * c / H;
      for (long j = 0; j < H; j++) rdx[t * H + j] = rs[t] * (w[j] * dy[t * H + j] - xs[t * H + j] * k);
      for (long j = 0; j < H; j++)
        rldx[t * H + j] = ls[t] * (double(w[j]) * dy[t * H + j] - sg / H - (xs[t * H + j] - ms[t]) * ls[t] * sgx / H);
    }
    std::vector<float> dx(T * H, NAN), ldx(T * H, NAN), dw(H, 0), db(H, 0), sc(col_reduce_scratch_floats(T, H, 2) + 1);
    rmsnorm_backward(dy.data(), xs.data(), w.data(), rs.data(), dx.data(), dw.data(), sc.data(), T, H, nullptr);
    layernorm_backward(dy.data(), xs.data(), w.data(), ms.data(), ls.data(), ldx.data(), dw.data(), db.data(),
                       sc.data(), T, H, nullptr);
    snprintf(buf, 100, "rms dx H=%ld", H);
    check(buf, relerr(dx, rdx), 1e-5);
    snprintf(buf, 100, "ln dx H=%ld", H);
    check(buf, relerr(ldx, rldx), 1e-5);
  }
  // RoPE pairs: in place vs out of place vs a direct reference, both pairings, partial rotation with offset.
  {
    const long S = 5, BN = 3, D = 16;
    for (int inter = 0; inter < 2; inter++)
      for (long off : {0L, 4L})
        for (long rot : {8L, 12L}) {
          if (off + rot > D) continue;
          const long h = rot / 2;
          auto x = rnd(S * BN * D, 12), cs = rnd(S * h, 13), sn = rnd(S * h, 14);
          std::vector<double> ref(S * BN * D);
          for (long row = 0; row < S * BN; row++) {
            const long s = row / BN;
            for (long c = 0; c < D; c++) ref[row * D + c] = x[row * D + c];
            for (long i = 0; i < h; i++) {
              const long a = off + (inter ? 2 * i : i), b = inter ? a + 1 : a + h;
              ref[row * D + a] = double(x[row * D + a]) * cs[s * h + i] - double(x[row * D + b]) * sn[s * h + i];
              ref[row * D + b] = double(x[row * D + b]) * cs[s * h + i] + double(x[row * D + a]) * sn[s * h + i];
            }
          }
          std::vector<float> y(S * BN * D, NAN);
          rope(x.data(), cs.data(), sn.data(), y.data(), S, BN, D, off, rot, inter, 1.0f, nullptr);
          auto z = x;
          rope(z.data(), cs.data(), sn.data(), z.data(), S, BN, D, off, rot, inter, 1.0f, nullptr);
          char buf[100];
          snprintf(buf, 100, "rope inter=%d off=%ld rot=%ld out/in place", inter, off, rot);
          check(buf, std::max(relerr(y, ref), relerr(z, ref)), 1e-6);
        }
  }
  // The embedding backward: keys and order by the kernels, the stable sort (CUB on the GPU) on the host.
  for (long T : {1L, 7L, 300L})
    for (long VL : {3L, 50L})
      for (long vs : {0L, 2L}) {
        const long H = 37;
        std::vector<int64_t> ids(T);
        std::mt19937 g(T + VL);
        for (auto& i : ids) i = g() % 4 == 0 ? 1 : g() % (VL + 3);
        auto dy = rnd(T * H, 1), dw0 = rnd(VL * H, 2);
        std::vector<float> want = dw0;
        for (long t = 0; t < T; t++) {
          long r = ids[t] - vs;
          if (r < 0 || r >= VL) continue;
          for (long j = 0; j < H; j++) want[r * H + j] += dy[t * H + j];
        }
        std::vector<uint32_t> keys(T), keys_s(T);
        std::vector<int32_t> tok(T), tok_s(T);
        emu::launch(dim3(grid_for(T)), dim3(kThreads),
                    [&] { row_keys_k(ids.data(), true, T, VL, vs, keys.data(), tok.data()); });
        std::vector<int> order(T);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] < keys[b]; });
        for (long p = 0; p < T; p++) {
          keys_s[p] = keys[order[p]];
          tok_s[p] = tok[order[p]];
        }
        auto got = dw0;
        emu::launch(dim3(std::min<long>(T, 5)), dim3(kThreads),
                    [&] { add_runs_k(dy.data(), keys_s.data(), tok_s.data(), got.data(), T, H, VL); });
        const bool same = std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
        std::printf("embedding T=%ld VL=%ld start=%ld: %s\n", T, VL, vs, same ? "bitwise ok" : "DIFFERS");
        ok &= same;
      }
  std::printf(ok ? "all pass\n" : "FAILURES\n");
  return ok ? 0 : 1;
}
