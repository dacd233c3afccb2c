// The attention block kernel at global positions (kernels::attention_block_forward/backward, attention_merge) that
// context parallelism is built on: against a plain masked softmax, assembled from chunks against the single-rank
// kernel (forward, backward, dropout), and its gradients (block kernel + merge) against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/dropout.h"
#include "moecore/kernels/elementwise.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::max_rel_diff;
using testing::randn;

// o and lse of q rows at q0.. against keys at k0.. with the causal mask on global positions, in f64.
void plain_block(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale, Tensor& o,
                 Tensor& lse) {
  const int64_t Sq = q.dim(0), Sk = k.dim(0), B = q.dim(1), Nq = q.dim(2), Nkv = k.dim(2), D = q.dim(3);
  o = Tensor::zeros(q.shape(), DType::F64);
  lse = Tensor::empty({B, Nq, Sq}, DType::F64);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++)
      for (int64_t i = 0; i < Sq; i++) {
        const int64_t g = h / (Nq / Nkv);
        std::vector<double> s;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Sk && k0 + j <= q0 + i; j++) {
          double dot = 0;
          for (int64_t e = 0; e < D; e++)
            dot += q.item(((i * B + b) * Nq + h) * D + e) * k.item(((j * B + b) * Nkv + g) * D + e);
          s.push_back(dot * scale);
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        lse.set_item((b * Nq + h) * Sq + i, s.empty() ? -std::numeric_limits<double>::infinity() : mx + std::log(sum));
        for (size_t j = 0; j < s.size(); j++)
          for (int64_t e = 0; e < D; e++) {
            const int64_t at = ((i * B + b) * Nq + h) * D + e;
            o.set_item(at, o.item(at) + std::exp(s[j] - mx) / sum *
                                            v.item(((static_cast<int64_t>(j) * B + b) * Nkv + g) * D + e));
          }
      }
}

TEST(AttentionBlock, MatchesPlainMaskedSoftmax) {
  struct Case {
    int64_t Sq, Sk, q0, k0;
  };
  // Partial tiles across tile boundaries, the aligned diagonal, rows that see no key, wholly visible keys.
  for (Case c : {Case{40, 100, 70, 0}, Case{70, 70, 0, 0}, Case{30, 50, 10, 25}, Case{20, 30, 100, 3}}) {
    const int64_t B = 2, Nq = 4, Nkv = 2, D = 8;
    Tensor q = randn({c.Sq, B, Nq, D}, DType::F64, 1), k = randn({c.Sk, B, Nkv, D}, DType::F64, 2);
    Tensor v = randn({c.Sk, B, Nkv, D}, DType::F64, 3);
    const double scale = 0.4;
    Tensor o = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, Nq, c.Sq}, DType::F64), ro, rl;
    kernels::attention_block_forward(q, k, v, c.q0, c.k0, scale, o, lse);
    plain_block(q, k, v, c.q0, c.k0, scale, ro, rl);
    EXPECT_LT(max_rel_diff(o, ro), 1e-12) << c.Sq << " " << c.q0 << " " << c.k0;
    for (int64_t i = 0; i < lse.numel(); i++) {
      if (std::isinf(rl.item(i)))
        EXPECT_TRUE(std::isinf(lse.item(i)) && lse.item(i) < 0);
      else
        EXPECT_NEAR(lse.item(i), rl.item(i), 1e-12);
    }
    // f32 within f32 rounding.
    Tensor o32 = Tensor::empty(q.shape(), DType::F32), l32 = Tensor::empty({B, Nq, c.Sq}, DType::F32);
    kernels::attention_block_forward(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), c.q0, c.k0, scale, o32, l32);
    EXPECT_LT(max_rel_diff(o32, ro), 1e-5);
  }
}

// CP rank r's rows (chunks r and 2C−1−r of sc rows) of a whole sequence x.
Tensor rank_rows(const Tensor& x, int64_t r, int64_t C, int64_t sc) {
  Tensor out = Tensor::empty({2 * sc, x.dim(1), x.dim(2), x.dim(3)}, x.dtype());
  out.slice(0, sc).copy_from(x.slice(r * sc, sc));
  out.slice(sc, sc).copy_from(x.slice((2 * C - 1 - r) * sc, sc));
  return out;
}

struct Problem {
  int64_t C, sc, B, Nq, Nkv, D;
  DType dt;
};

// Every rank of a simulated CP group computes its rows against every key chunk with the block kernel and merges;
// backward sums every rank's dK/dV terms per key chunk. The result must be the single-rank kernel's.
void check_chunked(const Problem& p, const kernels::AttentionDropout* drop, double tol) {
  const int64_t S = 2 * p.C * p.sc;
  Tensor q = randn({S, p.B, p.Nq, p.D}, p.dt, 11), k = randn({S, p.B, p.Nkv, p.D}, p.dt, 12);
  Tensor v = randn({S, p.B, p.Nkv, p.D}, p.dt, 13), dout = randn(q.shape(), p.dt, 14);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  Tensor o = Tensor::empty(q.shape(), p.dt), lse = Tensor::empty({p.B, p.Nq, S}, p.dt);
  kernels::attention_forward(q, k, v, scale, o, lse, drop);
  Tensor dq = Tensor::empty(q.shape(), p.dt), dk = Tensor::empty(k.shape(), p.dt), dv = Tensor::empty(v.shape(), p.dt);
  kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv, drop);
  Tensor dk_sum = Tensor::zeros(k.shape(), p.dt), dv_sum = Tensor::zeros(v.shape(), p.dt);
  for (int64_t r = 0; r < p.C; r++) {
    const int64_t ids[2] = {r, 2 * p.C - 1 - r};
    Tensor qr = rank_rows(q, r, p.C, p.sc), dor = rank_rows(dout, r, p.C, p.sc);
    Tensor orr = Tensor::empty(qr.shape(), p.dt), dqr = Tensor::zeros(qr.shape(), p.dt);
    std::vector<Tensor> ls;
    for (int64_t i = 0; i < 2; i++) {
      Tensor oc = orr.slice(i * p.sc, p.sc), lc = Tensor::empty({p.B, p.Nq, p.sc}, p.dt);
      Tensor po = Tensor::empty(oc.shape(), p.dt), pl = Tensor::empty(lc.shape(), p.dt);
      for (int64_t c = 0; c < 2 * p.C; c++) {
        kernels::attention_block_forward(qr.slice(i * p.sc, p.sc), k.slice(c * p.sc, p.sc), v.slice(c * p.sc, p.sc),
                                         ids[i] * p.sc, c * p.sc, scale, c == 0 ? oc : po, c == 0 ? lc : pl, drop);
        if (c > 0) kernels::attention_merge(oc, lc, po, pl);
      }
      ls.push_back(lc);
      EXPECT_LT(max_rel_diff(oc, o.slice(ids[i] * p.sc, p.sc)), tol) << "rank " << r << " chunk " << ids[i];
    }
    for (int64_t i = 0; i < 2; i++)
      for (int64_t c = 0; c < 2 * p.C; c++) {
        Tensor dkc = Tensor::empty({p.sc, p.B, p.Nkv, p.D}, p.dt), dvc = Tensor::empty(dkc.shape(), p.dt);
        Tensor dqc = dqr.slice(i * p.sc, p.sc);
        kernels::attention_block_backward(
            dor.slice(i * p.sc, p.sc), qr.slice(i * p.sc, p.sc), k.slice(c * p.sc, p.sc), v.slice(c * p.sc, p.sc),
            orr.slice(i * p.sc, p.sc), ls[static_cast<size_t>(i)], ids[i] * p.sc, c * p.sc, scale, dqc, dkc, dvc, drop);
        Tensor a = dk_sum.slice(c * p.sc, p.sc), b = dv_sum.slice(c * p.sc, p.sc);
        kernels::add_(a, dkc);
        kernels::add_(b, dvc);
      }
    for (int64_t i = 0; i < 2; i++)
      EXPECT_LT(max_rel_diff(dqr.slice(i * p.sc, p.sc), dq.slice(ids[i] * p.sc, p.sc)), tol) << "dq rank " << r;
  }
  EXPECT_LT(max_rel_diff(dk_sum, dk), tol);
  EXPECT_LT(max_rel_diff(dv_sum, dv), tol);
}

TEST(AttentionBlock, ChunksMergeToTheSingleRankKernel) {
  check_chunked({2, 24, 2, 4, 2, 8, DType::F64}, nullptr, 1e-12);
  check_chunked({4, 40, 1, 4, 1, 16, DType::F32}, nullptr, 1e-5);  // chunks cross tile boundaries
  check_chunked({3, 70, 1, 2, 2, 8, DType::F32}, nullptr, 1e-5);   // chunks longer than a tile
}

TEST(AttentionBlock, DropoutKeyedByGlobalPositions) {
  const std::vector<int64_t> samples = {13, 4};
  kernels::AttentionDropout d;
  d.mask = kernels::DropoutMask::make(77, 3, 0.3);
  d.sample_B = samples.data();
  d.head_offset = 2;
  check_chunked({2, 24, 2, 4, 2, 8, DType::F64}, &d, 1e-12);
  check_chunked({4, 40, 2, 2, 1, 8, DType::F32}, &d, 1e-5);
}

// Gradients of the block kernel and the merge: o of two query chunks, each merged from three key blocks of uneven
// sizes, against central differences of Σ W ⊙ o (f64).
TEST(AttentionBlockGrad, BlocksAndMergeMatchFiniteDifferences) {
  const int64_t B = 2, Nq = 2, Nkv = 1, D = 4;
  const int64_t q_pos[2] = {5, 17}, q_len[2] = {6, 9};
  const int64_t k_pos[3] = {0, 7, 13}, k_len[3] = {7, 6, 13};
  const std::vector<int64_t> samples = {3, 8};
  kernels::AttentionDropout d;
  d.mask = kernels::DropoutMask::make(5, 9, 0.25);
  d.sample_B = samples.data();
  for (const kernels::AttentionDropout* drop :
       {static_cast<const kernels::AttentionDropout*>(nullptr), static_cast<const kernels::AttentionDropout*>(&d)}) {
    Tensor q[2] = {randn({q_len[0], B, Nq, D}, DType::F64, 1), randn({q_len[1], B, Nq, D}, DType::F64, 2)};
    Tensor k[3], v[3];
    for (int j = 0; j < 3; j++) {
      k[j] = randn({k_len[j], B, Nkv, D}, DType::F64, 10 + j);
      v[j] = randn({k_len[j], B, Nkv, D}, DType::F64, 20 + j);
    }
    Tensor W[2] = {randn(q[0].shape(), DType::F64, 30), randn(q[1].shape(), DType::F64, 31)};
    const double scale = 0.5;
    auto forward = [&](int i, Tensor& o, Tensor& lse) {
      o = Tensor::empty(q[i].shape(), DType::F64);
      lse = Tensor::empty({B, Nq, q_len[i]}, DType::F64);
      Tensor po = Tensor::empty(o.shape(), DType::F64), pl = Tensor::empty(lse.shape(), DType::F64);
      for (int j = 0; j < 3; j++) {
        kernels::attention_block_forward(q[i], k[j], v[j], q_pos[i], k_pos[j], scale, j == 0 ? o : po,
                                         j == 0 ? lse : pl, drop);
        if (j > 0) kernels::attention_merge(o, lse, po, pl);
      }
    };
    auto loss = [&] {
      double s = 0;
      for (int i = 0; i < 2; i++) {
        Tensor o, lse;
        forward(i, o, lse);
        s += kernels::dot(o, W[i]);
      }
      return s;
    };
    Tensor dq[2], dk[3], dv[3];
    for (int j = 0; j < 3; j++)
      dk[j] = Tensor::zeros(k[j].shape(), DType::F64), dv[j] = Tensor::zeros(k[j].shape(), DType::F64);
    for (int i = 0; i < 2; i++) {
      Tensor o, lse;
      forward(i, o, lse);
      dq[i] = Tensor::zeros(q[i].shape(), DType::F64);
      for (int j = 0; j < 3; j++) {
        Tensor gk = Tensor::empty(k[j].shape(), DType::F64), gv = Tensor::empty(k[j].shape(), DType::F64);
        kernels::attention_block_backward(W[i], q[i], k[j], v[j], o, lse, q_pos[i], k_pos[j], scale, dq[i], gk, gv,
                                          drop);
        kernels::add_(dk[j], gk);
        kernels::add_(dv[j], gv);
      }
    }
    for (int i = 0; i < 2; i++) EXPECT_LT(testing::fd_rel_error(loss, q[i], dq[i]), testing::kGradTol);
    for (int j = 0; j < 3; j++) {
      EXPECT_LT(testing::fd_rel_error(loss, k[j], dk[j]), testing::kGradTol) << "k block " << j;
      EXPECT_LT(testing::fd_rel_error(loss, v[j], dv[j]), testing::kGradTol) << "v block " << j;
    }
  }
}

// bf16 operands: within bf16 rounding of the f64 result, and rounded (not the f32 result).
TEST(AttentionBlock, Bf16OperandsRounded) {
  const int64_t Sq = 50, Sk = 90, B = 1, Nq = 2, Nkv = 1, D = 16;
  Tensor q = randn({Sq, B, Nq, D}, DType::F64, 1), k = randn({Sk, B, Nkv, D}, DType::F64, 2);
  Tensor v = randn({Sk, B, Nkv, D}, DType::F64, 3);
  Tensor ro, rl;
  plain_block(q, k, v, 60, 0, 0.25, ro, rl);
  Tensor o = Tensor::empty(q.shape(), DType::F32), l = Tensor::empty({B, Nq, Sq}, DType::F32);
  Tensor o32 = Tensor::empty(q.shape(), DType::F32);
  kernels::attention_block_forward(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), 60, 0, 0.25, o, l, nullptr,
                                   /*round_bf16=*/true);
  kernels::attention_block_forward(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), 60, 0, 0.25, o32, l);
  EXPECT_LT(max_rel_diff(o, ro), 3e-2);
  EXPECT_GT(max_rel_diff(o, o32), 1e-5);
}

}  // namespace
}  // namespace moecore
