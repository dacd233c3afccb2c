// Host emulation of the elementwise CUDA kernels that have no tensor cores (col_reduce.cu, norm_bias.cu,
// elementwise.cu, embedding_bwd.cu), for machines without a GPU: blocks run one at a time, each CUDA thread a
// std::thread, __syncthreads a block barrier, __shfl_xor_sync an exchange through per-warp slots, __shared__ a static
// (one block at a time). The kernels' own source is compiled after cuda_kernels_emulate.py rewrites their launches;
// results are checked against f64 host references (1e-5), the embedding backward bitwise against the CPU kernel's
// order. It checks indexing, chunking, masking and the reduction trees; not timing. Built and run by run.sh (CTest
// cuda_kernels_host_emulation).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace emu {
thread_local uint3 tid, bid;
dim3 bdim, gdim;
std::barrier<>* block_bar = nullptr;
std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
std::vector<std::vector<float>> slots;
void launch(dim3 grid, dim3 block, const std::function<void()>& k) {
  bdim = block;
  gdim = grid;
  const unsigned nt = block.x;
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      std::barrier<> bar(nt);
      block_bar = &bar;
      warp_bars.clear();
      slots.assign(nt / 32, std::vector<float>(32));
      for (unsigned w = 0; w < nt / 32; w++) warp_bars.push_back(std::make_unique<std::barrier<>>(32));
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < nt; t++)
        ts.emplace_back([&, t] {
          tid = uint3{t, 0, 0};
          bid = uint3{bx, by, 0};
          k();
        });
      for (auto& t : ts) t.join();
    }
}
}  // namespace emu
#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define blockDim (emu::bdim)
#define gridDim (emu::gdim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
inline void __syncthreads() {
  emu::block_bar->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  const int w = emu::tid.x / 32, l = emu::tid.x % 32;
  emu::slots[w][l] = v;
  emu::warp_bars[w]->arrive_and_wait();
  const float r = emu::slots[w][l ^ m];
  emu::warp_bars[w]->arrive_and_wait();
  return r;
}
template <typename T>
cudaError_t emu_malloc(T** p, size_t n) {
  *p = static_cast<T*>(malloc(n));
  return cudaSuccess;
}
#define cudaMallocAsync(pp, n, s) emu_malloc(pp, n)
#define cudaFreeAsync(p, s) (free(p), cudaSuccess)
#define cudaMemcpyAsync(d, s, n, k, st) (memcpy(d, s, n), cudaSuccess)
using std::isfinite;
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"

// The kernels, rewritten by cuda_kernels_emulate.py (after the shims above and the headers they use).
#include "cuda_kernels_emulate.inc"

using namespace moecore::launch;
std::vector<float> rnd(size_t n, unsigned seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}
double relerr(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < b.size(); i++) {
    if (!std::isfinite(a[i])) return 1e9;
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}
int main() {
  bool ok = true;
  auto check = [&](const char* what, double e, double tol) {
    std::printf("%-50s %.2e %s\n", what, e, e < tol ? "ok" : "FAIL");
    ok &= e < tol;
  };
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
