// Every CUDA kernel against its CPU kernel on random shapes: f32 within 1e-5 of the reference's magnitude, bf16
// within the stated tolerance; reruns on the GPU give the same bits. Skipped (one line) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/embedding.h"
#include "moecore/kernels/fp8.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/id_checks.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/kernels/rope.h"

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

constexpr double kF32 = 1e-5;
constexpr double kBf16Gemm = 1e-2;  // bf16 operands, f32 accumulation in both: only the summation order differs

struct GemmCase {
  int64_t M, N, K;
  bool ta, tb;
};

TEST(CudaKernels, GemmMatchesTheCpuInF32AndBf16) {
  MOE_REQUIRE_GPU();
  for (const GemmCase& c : {GemmCase{7, 5, 3, false, false}, GemmCase{64, 48, 96, true, false},
                            GemmCase{33, 129, 65, false, true}, GemmCase{128, 64, 256, true, true}}) {
    const Tensor A = host_random(c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, 1);
    const Tensor B = host_random(c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, 2);
    const Tensor C0 = host_random({c.M, c.N}, 3);
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor want = C0.clone();
      gemm(A.to(dt), c.ta, B.to(dt), c.tb, want, 0.5f, 1.0f);
      Tensor got = gpu(C0);
      gemm(gpu(A).to(dt), c.ta, gpu(B).to(dt), c.tb, got, 0.5f, 1.0f);
      EXPECT_LT(rel_diff(got, want), dt == DType::F32 ? kF32 : kBf16Gemm)
          << c.M << "x" << c.N << "x" << c.K << " " << dtype_name(dt);
    }
  }
}

TEST(CudaKernels, GemmOnUnalignedViews) {
  MOE_REQUIRE_GPU();
  // Row 1 of a [*, 7] bf16 matrix starts 14 bytes in: cuBLASLt must not assume 256-byte aligned operands.
  const Tensor A = host_random({10, 7}, 30), B = host_random({8, 5}, 31);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor want = Tensor::empty({9, 5}, DType::F32);
    gemm(A.slice(1, 9).to(dt), false, B.slice(1, 7).to(dt), false, want);
    const Tensor gA = gpu(A).to(dt), gB = gpu(B).to(dt);
    Tensor got = Tensor::empty({10, 5}, DType::F32, Device::cuda());
    Tensor out = got.slice(1, 9);
    gemm(gA.slice(1, 9), false, gB.slice(1, 7), false, out);
    EXPECT_LT(rel_diff(out, want), dt == DType::F32 ? kF32 : kBf16Gemm) << dtype_name(dt);
  }
}

TEST(CudaKernels, BatchedGemmMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const Tensor A = host_random({3, 17, 9}, 4), B = host_random({3, 9, 11}, 5);
  Tensor want = Tensor::empty({3, 17, 11}, DType::F32);
  gemm_batched(A, false, B, false, want);
  Tensor got = Tensor::empty({3, 17, 11}, DType::F32, Device::cuda());
  gemm_batched(gpu(A), false, gpu(B), false, got);
  EXPECT_LT(rel_diff(got, want), kF32);
}

TEST(CudaKernels, RmsNormForwardAndBackward) {
  MOE_REQUIRE_GPU();
  for (int64_t H : {32, 257, 1024}) {
    const int64_t T = 19;
    const Tensor x = host_random({T, H}, 6), w = host_random({H}, 7), dy = host_random({T, H}, 8);
    Tensor y = Tensor::empty({T, H}, DType::F32), r = Tensor::empty({T}, DType::F32);
    rmsnorm_forward(x, w, 1e-5, y, r);
    Tensor gy = Tensor::empty({T, H}, DType::F32, Device::cuda()), gr = Tensor::empty({T}, DType::F32, Device::cuda());
    rmsnorm_forward(gpu(x), gpu(w), 1e-5, gy, gr);
    EXPECT_LT(rel_diff(gy, y), kF32);
    EXPECT_LT(rel_diff(gr, r), kF32);
    Tensor dx = Tensor::empty({T, H}, DType::F32), dw = Tensor::zeros({H}, DType::F32);
    rmsnorm_backward(dy, x, w, r, dx, dw);
    Tensor gdx = Tensor::empty({T, H}, DType::F32, Device::cuda()),
           gdw = Tensor::zeros({H}, DType::F32, Device::cuda());
    rmsnorm_backward(gpu(dy), gpu(x), gpu(w), gr, gdx, gdw);
    EXPECT_LT(rel_diff(gdx, dx), kF32);
    EXPECT_LT(rel_diff(gdw, dw), kF32);
  }
}

TEST(CudaKernels, LayerNormForwardAndBackward) {
  MOE_REQUIRE_GPU();
  const Device g = Device::cuda();
  for (int64_t H : {32, 257, 1024}) {
    const int64_t T = 19;
    const Tensor x = host_random({T, H}, 40, 2.0), w = host_random({H}, 41), b = host_random({H}, 42);
    const Tensor dy = host_random({T, H}, 43);
    Tensor y = Tensor::empty({T, H}, DType::F32), mu = Tensor::empty({T}, DType::F32),
           r = Tensor::empty({T}, DType::F32);
    layernorm_forward(x, w, b, 1e-5, y, mu, r);
    Tensor gy = Tensor::empty({T, H}, DType::F32, g), gmu = Tensor::empty({T}, DType::F32, g),
           gr = Tensor::empty({T}, DType::F32, g);
    layernorm_forward(gpu(x), gpu(w), gpu(b), 1e-5, gy, gmu, gr);
    EXPECT_LT(rel_diff(gy, y), kF32);
    EXPECT_LT(rel_diff(gr, r), kF32);
    Tensor dx = Tensor::empty({T, H}, DType::F32), dw = Tensor::zeros({H}, DType::F32),
           db = Tensor::zeros({H}, DType::F32);
    layernorm_backward(dy, x, w, mu, r, dx, dw, db);
    Tensor gdx = Tensor::empty({T, H}, DType::F32, g), gdw = Tensor::zeros({H}, DType::F32, g),
           gdb = Tensor::zeros({H}, DType::F32, g);
    layernorm_backward(gpu(dy), gpu(x), gpu(w), gmu, gr, gdx, gdw, gdb);
    EXPECT_LT(rel_diff(gdx, dx), kF32);
    EXPECT_LT(rel_diff(gdw, dw), kF32);
    EXPECT_LT(rel_diff(gdb, db), kF32);
  }
}

TEST(CudaKernels, RowBiasAndColumnSums) {
  MOE_REQUIRE_GPU();
  const Tensor y0 = host_random({23, 70}, 44), b = host_random({70}, 45);
  Tensor y = y0.clone(), gy = gpu(y0);
  add_row_bias_(y, b);
  add_row_bias_(gy, gpu(b));
  EXPECT_EQ(rel_diff(gy, y), 0.0);
  Tensor db = b.clone(), gdb = gpu(b);
  accumulate_col_sums(y0, db);
  accumulate_col_sums(gpu(y0), gdb);
  EXPECT_LT(rel_diff(gdb, db), kF32);
}

// The experts' biases: per-segment rows (an empty segment, a gap row), each row's bias scaled by its probability;
// the backward's column sums and row dots, from f32 and from bf16 rows.
TEST(CudaKernels, SegmentBiasForwardAndBackward) {
  MOE_REQUIRE_GPU();
  const int64_t R = 300, N = 70;
  const std::vector<int64_t> begin{0, 40, 40, 41}, count{40, 0, 1, 259};
  const RowSegments seg{begin, count};
  const Tensor y0 = host_random({R, N}, 46), b = host_random({4, N}, 47), w = host_random({R}, 48);
  Tensor y = y0.clone(), gy = gpu(y0);
  const Tensor gb = gpu(b), gw = gpu(w);
  segment_bias_forward(b, &w, seg, y);
  segment_bias_forward(gb, &gw, seg, gy);
  EXPECT_LT(rel_diff(gy, y), kF32);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor dy = host_random({R, N}, 49).to(dt);
    Tensor db = host_random({4, N}, 50), dw = host_random({R}, 51);
    Tensor gdb = gpu(db), gdw = gpu(dw);
    segment_bias_backward(dy, &w, seg, db, &b, &dw);
    segment_bias_backward(gpu(dy), &gw, seg, gdb, &gb, &gdw);
    EXPECT_LT(rel_diff(gdb, db), kF32) << dtype_name(dt);
    EXPECT_LT(rel_diff(gdw, dw), kF32) << dtype_name(dt);
    Tensor gdb2 = gpu(host_random({4, N}, 50)), gdw2 = gpu(host_random({R}, 51));
    segment_bias_backward(gpu(dy), &gw, seg, gdb2, &gb, &gdw2);
    EXPECT_TRUE(bitwise_equal(gdb, gdb2) && bitwise_equal(gdw, gdw2)) << dtype_name(dt) << ": rerun";
  }
}

TEST(CudaKernels, RopeBothPairingsForwardAndBackward) {
  MOE_REQUIRE_GPU();
  const int64_t S = 11, B = 2, N = 3, D = 16;
  for (RopePairs pairs : {RopePairs::RotateHalf, RopePairs::Interleaved})
    for (int64_t rot : {int64_t{8}, D}) {
      Tensor cs, sn;
      rope_tables(S, rot, 10000.0, DType::F32, cs, sn);
      const Tensor x = host_random({S, B, N, D}, 9);
      for (int dir = 0; dir < 2; dir++) {
        Tensor y = Tensor::empty(x.shape(), DType::F32), gy = Tensor::empty(x.shape(), DType::F32, Device::cuda());
        if (dir == 0) {
          rope_forward_at(x, cs, sn, 0, rot, pairs, y);
          rope_forward_at(gpu(x), gpu(cs), gpu(sn), 0, rot, pairs, gy);
        } else {
          rope_backward_at(x, cs, sn, 0, rot, pairs, y);
          rope_backward_at(gpu(x), gpu(cs), gpu(sn), 0, rot, pairs, gy);
        }
        EXPECT_LT(rel_diff(gy, y), kF32) << "rot " << rot << " dir " << dir;
      }
      Tensor inplace = gpu(x), want = Tensor::empty(x.shape(), DType::F32);  // y aliasing x
      rope_forward_at(x, cs, sn, 0, rot, pairs, want);
      rope_forward_at(inplace, gpu(cs), gpu(sn), 0, rot, pairs, inplace);
      EXPECT_LT(rel_diff(inplace, want), kF32);
    }
}

TEST(CudaKernels, ActivationsWithAndWithoutRowScales) {
  MOE_REQUIRE_GPU();
  const int64_t T = 13, F = 37;
  for (Activation act : {Activation::SwiGLU, Activation::GeLU, Activation::SquaredReLU}) {
    const int64_t in = is_gated(act) ? 2 * F : F;
    const Tensor x = host_random({T, in}, 10, 3.0), p = host_random({T}, 11), dy = host_random({T, F}, 12);
    for (bool scaled : {false, true}) {
      const Tensor* pp = scaled ? &p : nullptr;
      const Tensor gp = gpu(p);
      const Tensor* gpp = scaled ? &gp : nullptr;
      Tensor y = Tensor::empty({T, F}, DType::F32), gy = Tensor::empty({T, F}, DType::F32, Device::cuda());
      activation_forward(act, x, pp, y);
      activation_forward(act, gpu(x), gpp, gy);
      EXPECT_LT(rel_diff(gy, y), kF32) << activation_name(act);
      Tensor dx = Tensor::empty(x.shape(), DType::F32), dp = Tensor::empty({T}, DType::F32);
      Tensor gdx = Tensor::empty(x.shape(), DType::F32, Device::cuda()),
             gdp = Tensor::empty({T}, DType::F32, Device::cuda());
      activation_backward(act, dy, x, pp, dx, scaled ? &dp : nullptr);
      activation_backward(act, gpu(dy), gpu(x), gpp, gdx, scaled ? &gdp : nullptr);
      EXPECT_LT(rel_diff(gdx, dx), kF32) << activation_name(act);
      if (scaled) {
        EXPECT_LT(rel_diff(gdp, dp), kF32) << activation_name(act);
      }
    }
  }
}

Tensor ids_of(std::initializer_list<int64_t> v, DType dt) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, dt);
  int64_t i = 0;
  for (int64_t x : v) t.set_item(i++, static_cast<double>(x));
  return t;
}

TEST(CudaKernels, EmbeddingForwardAndDeterministicBackward) {
  MOE_REQUIRE_GPU();
  const int64_t V = 10, H = 33;
  for (DType idt : {DType::I32, DType::I64}) {
    const Tensor ids = ids_of({3, 7, 3, 0, 9, 3, 7}, idt);  // repeated ids: the backward sums them in token order
    const Tensor w = host_random({V, H}, 13), dy = host_random({7, H}, 14);
    Tensor y = Tensor::empty({7, H}, DType::F32), gy = Tensor::empty({7, H}, DType::F32, Device::cuda());
    embedding_forward(ids, w, y);
    embedding_forward(gpu(ids), gpu(w), gy);
    EXPECT_EQ(rel_diff(gy, y), 0.0);
    Tensor dw = Tensor::zeros({V, H}, DType::F32), gdw = Tensor::zeros({V, H}, DType::F32, Device::cuda());
    embedding_backward(dy, ids, dw);
    embedding_backward(gpu(dy), gpu(ids), gdw);
    EXPECT_EQ(rel_diff(gdw, dw), 0.0);  // same order, same bits as the CPU
    // A vocabulary shard (tensor parallelism): rows [4, 8) of 10.
    Tensor ys = Tensor::empty({7, H}, DType::F32), gys = Tensor::empty({7, H}, DType::F32, Device::cuda());
    embedding_forward(ids, w.slice(4, 4), ys, 4, V);
    embedding_forward(gpu(ids), gpu(w.slice(4, 4)), gys, 4, V);
    EXPECT_EQ(rel_diff(gys, ys), 0.0);
  }
  const Tensor bad = ids_of({1, 12}, DType::I32);
  Tensor y = Tensor::empty({2, H}, DType::F32, Device::cuda());
  // Recorded on the device (no read-back) and raised when the record is read (kernels/id_checks.h).
  kernels::set_id_check_iteration(3);
  embedding_forward(gpu(bad), gpu(host_random({V, H}, 1)), y);
  try {
    kernels::raise_deferred_id_checks();
    FAIL() << "an id outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iteration 3: token id 12 at position 1 is outside the vocabulary [0, 10)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaKernels, CrossEntropyForwardBackwardAndVocabParallel) {
  MOE_REQUIRE_GPU();
  const int64_t T = 9, V = 50;
  const Tensor logits = host_random({T, V}, 15, 4.0), dloss = host_random({T}, 16);
  const Tensor tgt = ids_of({0, 49, 7, 7, 20, 33, 1, 48, 25}, DType::I64);
  Tensor loss = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
  cross_entropy_forward(logits, tgt, loss, lse);
  Tensor gl = Tensor::empty({T}, DType::F32, Device::cuda()), glse = Tensor::empty({T}, DType::F32, Device::cuda());
  const Tensor glog = gpu(logits);
  cross_entropy_forward(glog, gpu(tgt), gl, glse);
  EXPECT_LT(rel_diff(gl, loss), kF32);
  EXPECT_LT(rel_diff(glse, lse), kF32);
  Tensor d = Tensor::empty({T, V}, DType::F32), gd = Tensor::empty({T, V}, DType::F32, Device::cuda());
  cross_entropy_backward(dloss, logits, tgt, lse, d);
  cross_entropy_backward(gpu(dloss), glog, gpu(tgt), glse, gd, 0);
  EXPECT_LT(rel_diff(gd, d), kF32);
  // Vocab-parallel with a host-staged all-reduce over one "rank": the same numbers.
  int calls = 0;
  // The reduction gets the logits' device's tensors (a process group stages them through the host or hands them to
  // NCCL); over one rank it leaves them as they are.
  const ReduceFn reduce = [&](Tensor& t, bool) {
    EXPECT_TRUE(t.device().is_cuda());
    calls++;
  };
  Tensor pl = Tensor::empty({T}, DType::F32, Device::cuda()), plse = Tensor::empty({T}, DType::F32, Device::cuda());
  cross_entropy_forward_vocab_parallel(glog, gpu(tgt), 0, V, reduce, pl, plse);
  EXPECT_EQ(calls, 2);
  EXPECT_LT(rel_diff(pl, loss), kF32);
}

TEST(CudaKernels, AdamWOneAndManyTensors) {
  MOE_REQUIRE_GPU();
  AdamWParams hp;
  hp.lr = 1e-2, hp.weight_decay = 0.1, hp.grad_scale = 0.5;
  std::vector<Tensor> p, g, m, v, gp, gg, gm, gv;
  for (int i = 0; i < 30; i++) {  // more than one launch's worth (launch.h kAdamTensors)
    const int64_t n = 1 + 37 * i;
    p.push_back(host_random({n}, 100 + i));
    g.push_back(host_random({n}, 200 + i));
    m.push_back(Tensor::zeros({n}, DType::F32));
    v.push_back(Tensor::zeros({n}, DType::F32));
    gp.push_back(gpu(p.back())), gg.push_back(gpu(g.back())), gm.push_back(gpu(m.back())), gv.push_back(gpu(v.back()));
  }
  // The GPU's lists in as few launches as possible, against the CPU one tensor at a time (the list API is the CUDA
  // build's own: a CPU-only build compiles this test and skips it).
#ifdef MOECORE_HAVE_CUDA
  std::vector<cuda::AdamWTensors> list;
  for (int i = 0; i < 30; i++) list.push_back({&gp[i], &gg[i], &gm[i], &gv[i]});
  for (int64_t step = 1; step <= 3; step++) {
    for (int i = 0; i < 30; i++) adamw_step(p[i], g[i], m[i], v[i], hp, step);
    cuda::adamw_multi_step(list, hp, step);
  }
#endif
  for (int i = 0; i < 30; i++) {
    EXPECT_LT(rel_diff(gp[i], p[i]), kF32) << i;
    EXPECT_LT(rel_diff(gv[i], v[i]), kF32) << i;
  }
  Tensor one = gpu(p[0]), gm0 = gpu(m[0]), gv0 = gpu(v[0]);  // the single-tensor entry point dispatches too
  adamw_step(one, gg[0], gm0, gv0, hp, 4);
  adamw_step(p[0], g[0], m[0], v[0], hp, 4);
  EXPECT_LT(rel_diff(one, p[0]), kF32);
}

TEST(CudaKernels, ElementwiseAndDeterministicSums) {
  MOE_REQUIRE_GPU();
  const Tensor a = host_random({1000, 3}, 17), b = host_random({1000, 3}, 18);
  Tensor ga = gpu(a), out = Tensor::empty(a.shape(), DType::F32, Device::cuda());
  add(ga, gpu(b), out);
  Tensor want = Tensor::empty(a.shape(), DType::F32);
  add(a, b, want);
  EXPECT_LT(rel_diff(out, want), kF32);
  EXPECT_NEAR(sum_squares(ga), sum_squares(a), 1e-9 * sum_squares(a));
  EXPECT_NEAR(dot(ga, gpu(b)), dot(a, b), 1e-9 * sum_squares(a));
  EXPECT_NEAR(sum(ga), sum(a), 1e-6);
  EXPECT_EQ(sum_squares(ga), sum_squares(ga));  // fixed tree: the same bits every time
  scale_(ga, 2.0);
  fill_(out, 1.5);
  EXPECT_EQ(out.item(17), 1.5);
  EXPECT_EQ(ga.item(5), 2 * a.item(5));
}

struct AttnCase {
  int64_t S, B, Nq, Nkv, D;
};

TEST(CudaKernels, AttentionForwardBackwardF32AndBf16) {
  MOE_REQUIRE_GPU();
  for (const AttnCase& c :
       {AttnCase{1, 1, 1, 1, 8}, AttnCase{37, 2, 4, 2, 32}, AttnCase{70, 1, 6, 3, 64}, AttnCase{16, 2, 2, 1, 128}}) {
    const Tensor q = host_random({c.S, c.B, c.Nq, c.D}, 20), k = host_random({c.S, c.B, c.Nkv, c.D}, 21);
    const Tensor v = host_random(k.shape(), 22), dout = host_random(q.shape(), 23);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    for (bool bf16 : {false, true}) {
      const double tol = bf16 ? 2e-2 : kF32;  // bf16: P and dS rounded at different points than the CPU tiles
      Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({c.B, c.Nq, c.S}, DType::F32);
      Tensor go = Tensor::empty(q.shape(), DType::F32, Device::cuda()),
             glse = Tensor::empty({c.B, c.Nq, c.S}, DType::F32, Device::cuda());
      const Tensor gq = gpu(q), gk = gpu(k), gv = gpu(v), gd = gpu(dout);
      Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
             dv = Tensor::empty(v.shape(), DType::F32);
      Tensor gdq = Tensor::empty(q.shape(), DType::F32, Device::cuda()),
             gdk = Tensor::empty(k.shape(), DType::F32, Device::cuda()),
             gdv = Tensor::empty(v.shape(), DType::F32, Device::cuda());
      if (bf16) {
        attention_forward_bf16(q, k, v, scale, o, lse);
        attention_forward_bf16(gq, gk, gv, scale, go, glse);
        attention_backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv);
        attention_backward_bf16(gd, gq, gk, gv, go, glse, scale, gdq, gdk, gdv);
      } else {
        attention_forward(q, k, v, scale, o, lse);
        attention_forward(gq, gk, gv, scale, go, glse);
        attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv);
        attention_backward(gd, gq, gk, gv, go, glse, scale, gdq, gdk, gdv);
      }
      const std::string what = "S" + std::to_string(c.S) + " D" + std::to_string(c.D) + (bf16 ? " bf16" : " f32");
      EXPECT_LT(rel_diff(go, o), tol) << what;
      EXPECT_LT(rel_diff(glse, lse), tol) << what;
      // At S 1 dQ and dK are 0 in exact arithmetic (one key: the softmax's gradient vanishes); each kernel leaves its
      // own rounding residue there, so they are measured against dV's scale, not their own.
      EXPECT_LT(rel_diff(gdq, dq, c.S == 1 ? dv : dq), tol) << what;
      EXPECT_LT(rel_diff(gdk, dk, c.S == 1 ? dv : dk), tol) << what;
      EXPECT_LT(rel_diff(gdv, dv), tol) << what;
      // Rerun: the same bits (every output row has one writer).
      Tensor gdq2 = Tensor::empty(q.shape(), DType::F32, Device::cuda()),
             gdk2 = Tensor::empty(k.shape(), DType::F32, Device::cuda()),
             gdv2 = Tensor::empty(v.shape(), DType::F32, Device::cuda());
      if (bf16)
        attention_backward_bf16(gd, gq, gk, gv, go, glse, scale, gdq2, gdk2, gdv2);
      else
        attention_backward(gd, gq, gk, gv, go, glse, scale, gdq2, gdk2, gdv2);
      EXPECT_TRUE(bitwise_equal(gdq, gdq2) && bitwise_equal(gdk, gdk2) && bitwise_equal(gdv, gdv2)) << what;
    }
  }
}

// The ops with only a CPU kernel refuse a GPU tensor with a message naming the op, instead of reading device memory.
TEST(CudaKernels, CpuOnlyOpsRefuseAGpuTensorByName) {
  MOE_REQUIRE_GPU();
  auto message = [](const std::function<void()>& run) {
    try {
      run();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // FP8's emulation is the CPU's alone (--fp8-format is refused with --device cuda before any work).
  const Tensor x = gpu(host_random({4, 8}, 1));
  EXPECT_NE(message([&] { fp8_amax(x); }).find("runs on the CPU only"), std::string::npos);
  Tensor y = Tensor::empty({4, 8}, DType::F32, Device::cuda());
  EXPECT_NE(message([&] { fp8_quantize_tensorwise(x, Fp8Format::E4M3, 1.0f, y); }).find("runs on the CPU only"),
            std::string::npos);
}

}  // namespace
}  // namespace moecore::kernels
