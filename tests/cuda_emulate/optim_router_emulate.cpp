// Host emulation (emu_cuda.h) of the optimizer kernels and of the MoE kernels' Sinkhorn and large-top-k paths, for
// machines without a GPU: elementwise.cu's AdamW with bf16 moments, SGD and the zero count, routing.cu's per-token
// forward selecting by an f64 Sinkhorn cost, and moe_permute.cu's per-token row sort above its register bound. Each
// is checked bitwise against a host reference written as the CPU kernels compute (kernels/cpu/adamw_update.cpp,
// sgd_update.cpp, elementwise.cpp's count_zeros, routing.cpp's topk_row): the emulation has no fused multiply-add, so
// the operations round alike. And multi_tensor.cu's optimizer step (optim_multi_tensor_emulate.h): the gradient norm,
// clip factor and non-finite check on the device, AdamW and SGD over many tensors reading them, bitwise against
// elementwise.cu's single-tensor kernels and the host's clipping formula. Built and run by run.sh (CTest
// cuda_optim_router_host_emulation).
#include "emu_cuda.h"
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"
#include "moecore/kernels/cuda/launch_moe.h"
#include "moecore/kernels/cuda/launch_multi_tensor.h"
#include "moecore/kernels/cuda/launch_routing.h"
#include "moecore/kernels/dropout_philox.h"

// The f64 _rn intrinsics multi_tensor.cu uses: the host's operations (no fused multiply-add here).
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline double __dsqrt_rn(double a) {
  return std::sqrt(a);
}

// The kernels, rewritten by cuda_kernels_emulate.py.
#include "optim_router_emulate.inc"

using namespace moecore::launch;
namespace {
bool same_bits(const void* a, const void* b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}
uint16_t bf16_rne(float x) {  // round to nearest even, as float_to_bf16 (finite values)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
float bf16_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// AdamW with both moments in bf16 over two tensors of one launch, against the CPU kernel's loop; the second tensor
// also writes its updated parameter rounded to bf16 (a parameter stored in bf16, its f32 master in the optimizer).
bool adamw_bf16_case(int64_t n0, int64_t n1) {
  const AdamWScalars hp{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f - 0.9f * 0.9f, 1.0f - 0.999f * 0.999f, 0.5f};
  bool ok = true;
  std::vector<std::vector<float>> p(2), g(2);
  std::vector<std::vector<__nv_bfloat16>> m(2), v(2);
  std::vector<std::vector<uint16_t>> rm(2), rv(2);
  std::vector<std::vector<float>> rp(2);
  std::vector<__nv_bfloat16> pb(static_cast<size_t>(n1));
  AdamWBatch b;
  b.m_bf16 = b.v_bf16 = true;
  for (int k = 0; k < 2; k++) {
    const int64_t n = k ? n1 : n0;
    p[k] = emu::rnd(n, 10 + k);
    g[k] = emu::rnd(n, 20 + k);
    const auto m0 = emu::rnd(n, 30 + k, -0.1f, 0.1f), v0 = emu::rnd(n, 40 + k, 0, 0.01f);
    m[k].resize(n);
    v[k].resize(n);
    rm[k].resize(n);
    rv[k].resize(n);
    rp[k] = p[k];
    for (int64_t i = 0; i < n; i++) {
      rm[k][i] = bf16_rne(m0[i]);
      rv[k][i] = bf16_rne(v0[i]);
      std::memcpy(&m[k][i], &rm[k][i], 2);
      std::memcpy(&v[k][i], &rv[k][i], 2);
      const float gi = g[k][i] * hp.grad_scale;
      const float mi = hp.beta1 * bf16_float(rm[k][i]) + (1.0f - hp.beta1) * gi;
      const float vi = hp.beta2 * bf16_float(rv[k][i]) + (1.0f - hp.beta2) * gi * gi;
      rm[k][i] = bf16_rne(mi);
      rv[k][i] = bf16_rne(vi);
      rp[k][i] = rp[k][i] * (1.0f - hp.lr * hp.wd) - hp.lr * (mi / hp.bc1) / (std::sqrt(vi / hp.bc2) + hp.eps);
    }
    b.p[k] = p[k].data();
    b.g[k] = g[k].data();
    b.m[k] = m[k].data();
    b.v[k] = v[k].data();
    b.n[k] = n;
  }
  b.p_bf16[1] = pb.data();
  b.count = 2;
  adamw(b, hp, nullptr);
  for (int k = 0; k < 2; k++)
    ok &= same_bits(p[k].data(), rp[k].data(), p[k].size() * 4) &&
          same_bits(m[k].data(), rm[k].data(), m[k].size() * 2) &&
          same_bits(v[k].data(), rv[k].data(), v[k].size() * 2);
  std::vector<uint16_t> rpb(static_cast<size_t>(n1));
  for (int64_t i = 0; i < n1; i++) rpb[i] = bf16_rne(rp[1][i]);
  ok &= same_bits(pb.data(), rpb.data(), rpb.size() * 2);
  std::printf("adamw bf16 moments n=%ld,%ld: %s\n", long(n0), long(n1), ok ? "bitwise ok" : "FAIL");
  return ok;
}

bool sgd_case(int64_t n) {
  auto p = emu::rnd(n, 1), g = emu::rnd(n, 2), buf = emu::rnd(n, 3, -0.1f, 0.1f);
  auto rp = p, rb = buf;
  const float lr = 0.05f, wd = 0.01f, mom = 0.9f, gs = 0.75f;
  for (int64_t i = 0; i < n; i++) {  // kernels/cpu/sgd_update.cpp's loop
    const float d = g[i] * gs + wd * rp[i];
    rb[i] = mom * rb[i] + d;
    rp[i] = rp[i] - lr * rb[i];
  }
  sgd(p.data(), g.data(), buf.data(), n, lr, wd, mom, gs, nullptr);
  const bool ok = same_bits(p.data(), rp.data(), n * 4) && same_bits(buf.data(), rb.data(), n * 4);
  std::printf("sgd n=%ld: %s\n", long(n), ok ? "bitwise ok" : "FAIL");
  return ok;
}

bool count_zeros_case(int64_t n) {
  std::vector<float> a = emu::rnd(n, 5);
  std::mt19937 r(7);
  int64_t want = 0;
  for (int64_t i = 0; i < n; i++) {
    const unsigned c = r() % 5;
    if (c == 0) a[i] = 0.0f;
    if (c == 1) a[i] = -0.0f;
    if (c == 2 && i % 3 == 0) a[i] = NAN;  // not a zero
    want += a[i] == 0.0f;
  }
  int64_t got = -1;
  count_zeros(a.data(), n, &got, nullptr);
  std::printf("count_zeros n=%ld: %ld of %ld %s\n", long(n), long(got), long(want), got == want ? "ok" : "FAIL");
  return got == want;
}

// Sinkhorn selection: the experts are the top-k of the f64 cost (ties to the lower index, values apart only in f64
// beyond f32's precision kept apart), the probabilities the softmax of the logits at them.
bool sinkhorn_rows_case(int64_t T, int64_t E, int64_t K) {
  const auto l = emu::rnd(T * E, 11, -2, 2);
  std::vector<double> cost(T * E);
  std::mt19937 r(13);
  for (int64_t i = 0; i < T * E; i++) cost[i] = 0.5 + (r() % 7) * 1e-12;  // equal in f32, ordered in f64
  std::vector<int32_t> idx(T * K, -1), kept(T * K, 0);
  std::vector<float> p(T * K), probs(T * K);
  RouterRowArgs a;
  a.T = T;
  a.E = E;
  a.K = K;
  a.scale = 2.0f;
  a.used = l.data();
  a.sinkhorn = cost.data();
  a.idx = idx.data();
  a.p = p.data();
  a.probs = probs.data();
  a.kept = kept.data();
  router_rows(a, nullptr);
  bool ok = true;
  for (int64_t t = 0; t < T; t++) {
    std::vector<bool> taken(E, false);
    std::vector<float> rp(K);
    for (int64_t j = 0; j < K; j++) {  // kernels/cpu/routing.cpp's topk_row: repeated argmax over the untaken
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++)
        if (!taken[e] && (best < 0 || cost[t * E + e] > cost[t * E + best])) best = e;
      taken[best] = true;
      ok &= idx[t * K + j] == best && kept[t * K + j] == 1;
      rp[j] = l[t * E + best];
    }
    float mx = -INFINITY, s = 0;
    for (auto x : rp) mx = std::max(mx, x);
    for (auto& x : rp) s += (x = std::exp(x - mx));
    for (int64_t j = 0; j < K; j++) ok &= std::fabs(p[t * K + j] - rp[j] / s) <= 1e-6f * (rp[j] / s) + 1e-7f;
    for (int64_t j = 0; j < K; j++) ok &= probs[t * K + j] == p[t * K + j] * 2.0f;
  }
  std::printf("sinkhorn selection T=%ld E=%ld K=%ld: %s\n", long(T), long(E), long(K), ok ? "ok" : "FAIL");
  return ok;
}

// Each token's rows ascending, K below and above the register bound, dropped assignments (−1) among them.
bool token_rows_case(int64_t T, int64_t K) {
  std::vector<int32_t> row_of_i(T * K);
  std::mt19937 r(17);
  std::vector<int32_t> rows(T * K);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), r);
  std::vector<int64_t> off(T + 1, 0);
  for (int64_t i = 0; i < T * K; i++) row_of_i[i] = r() % 6 == 0 ? -1 : rows[i];
  for (int64_t t = 0; t < T; t++) {
    int64_t c = 0;
    for (int64_t j = 0; j < K; j++) c += row_of_i[t * K + j] >= 0;
    off[t + 1] = off[t] + c;
  }
  std::vector<int32_t> got(off[T] + 1, -7), want;
  emu::launch(dim3(grid_for(T)), dim3(kThreads),
              [&] { token_rows_kernel(row_of_i.data(), T, K, off.data(), got.data()); });
  for (int64_t t = 0; t < T; t++) {
    std::vector<int32_t> mine;
    for (int64_t j = 0; j < K; j++)
      if (row_of_i[t * K + j] >= 0) mine.push_back(row_of_i[t * K + j]);
    std::sort(mine.begin(), mine.end());
    want.insert(want.end(), mine.begin(), mine.end());
  }
  const bool ok = same_bits(got.data(), want.data(), want.size() * 4);
  std::printf("token rows T=%ld K=%ld: %s\n", long(T), long(K), ok ? "ok" : "FAIL");
  return ok;
}
}  // namespace

#include "optim_multi_tensor_emulate.h"

int main() {
  bool ok = true;
  ok &= adamw_bf16_case(1000, 70000);
  for (int64_t n : {1L, 777L, 300000L}) ok &= sgd_case(n);
  for (int64_t n : {1L, 1000L, 100000L}) ok &= count_zeros_case(n);
  ok &= sinkhorn_rows_case(37, 16, 4);
  ok &= sinkhorn_rows_case(5, 80, 72);
  for (int64_t K : {8L, 64L, 65L, 96L}) ok &= token_rows_case(9, K);
  ok &= multi_tensor_cases();
  std::printf(ok ? "all pass\n" : "FAILURES\n");
  return ok ? 0 : 1;
}
