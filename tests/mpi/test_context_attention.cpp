// Attention over context parallelism (nn/context_attention*.cpp) under mpirun (2 and 4 ranks, the world as the CP
// group): every --cp-comm-type gives this rank's rows of the single-rank kernel on the whole sequence, forward and
// backward, with GQA and with dropout, and reruns are bitwise identical.
#include <gtest/gtest.h>

#include <cmath>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/dropout.h"
#include "moecore/nn/context_attention.h"
#include "test_util.h"

namespace moecore {
namespace {

using comm::ProcessGroup;
using nn::CpCommType;
using testing::max_rel_diff;

Tensor rank_rows(const Tensor& x, int64_t r, int64_t C, int64_t sc) {
  Tensor out = Tensor::empty({2 * sc, x.dim(1), x.dim(2), x.dim(3)}, x.dtype());
  out.slice(0, sc).copy_from(x.slice(r * sc, sc));
  out.slice(sc, sc).copy_from(x.slice((2 * C - 1 - r) * sc, sc));
  return out;
}

// lse [B, N, S] -> this rank's columns [B, N, 2·sc].
Tensor rank_lse(const Tensor& lse, int64_t r, int64_t C, int64_t sc) {
  const int64_t BN = lse.dim(0) * lse.dim(1), S = lse.dim(2);
  Tensor out = Tensor::empty({lse.dim(0), lse.dim(1), 2 * sc}, lse.dtype());
  for (int64_t bn = 0; bn < BN; bn++)
    for (int64_t i = 0; i < 2 * sc; i++) {
      const int64_t pos = i < sc ? r * sc + i : (2 * C - 1 - r) * sc + i - sc;
      out.set_item(bn * 2 * sc + i, lse.item(bn * S + pos));
    }
  return out;
}

struct Shape4 {
  int64_t sc, B, Nq, Nkv, D;
};

struct Groups {
  ProcessGroup world, inner, outer;
};

Groups make_groups() {
  Groups g{ProcessGroup::world(), ProcessGroup::world(), ProcessGroup::world()};
  const int64_t n = g.world.size();
  if (n == 4) {  // [a2a 2, p2p 2]: inner groups of consecutive ranks, outer groups across them
    g.inner = g.world.split({{0, 1}, {2, 3}});
    g.outer = g.world.split({{0, 2}, {1, 3}});
  } else {  // [a2a n, p2p 1]
    comm::RankGroups ones;
    for (int64_t r = 0; r < n; r++) ones.push_back({r});
    g.outer = g.world.split(ones);
  }
  return g;
}

void check(CpCommType type, const Shape4& s, bool dropout) {
  static Groups groups = make_groups();
  const ProcessGroup& w = groups.world;
  const int64_t C = w.size(), r = w.rank(), S = 2 * C * s.sc;
  nn::ContextParallel cp;
  cp.group = &w;
  cp.size = C;
  cp.rank = r;
  cp.comm_type = type;
  if (type == CpCommType::A2AP2P) {
    cp.inner = &groups.inner;
    cp.outer = &groups.outer;
  }
  const std::vector<int64_t> samples = {7, 2};
  kernels::AttentionDropout d;
  d.mask = kernels::DropoutMask::make(31, 4, 0.2);
  d.sample_B = samples.data();
  const kernels::AttentionDropout* drop = dropout ? &d : nullptr;
  const DType dt = DType::F32;
  Tensor q = testing::randn({S, s.B, s.Nq, s.D}, dt, 1), k = testing::randn({S, s.B, s.Nkv, s.D}, dt, 2);
  Tensor v = testing::randn({S, s.B, s.Nkv, s.D}, dt, 3), dout = testing::randn(q.shape(), dt, 4);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  Tensor o = Tensor::empty(q.shape(), dt), lse = Tensor::empty({s.B, s.Nq, S}, dt);
  kernels::attention_forward(q, k, v, scale, o, lse, drop);
  Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
  kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv, drop);

  const Tensor ql = rank_rows(q, r, C, s.sc), kl = rank_rows(k, r, C, s.sc), vl = rank_rows(v, r, C, s.sc);
  const Tensor dol = rank_rows(dout, r, C, s.sc);
  Tensor results[2][5];
  for (int run = 0; run < 2; run++) {
    Tensor* res = results[run];
    Tensor ol = Tensor::empty(ql.shape(), dt), ll = Tensor::empty({s.B, s.Nq, 2 * s.sc}, dt);
    nn::context_attention_forward(ql, kl, vl, scale, cp, ol, ll, drop);
    Tensor dql = Tensor::empty(ql.shape(), dt), dkl = Tensor::empty(kl.shape(), dt),
           dvl = Tensor::empty(kl.shape(), dt);
    nn::context_attention_backward(dol, ql, kl, vl, ol, ll, scale, cp, dql, dkl, dvl, drop);
    res[0] = ol, res[1] = ll, res[2] = dql, res[3] = dkl, res[4] = dvl;
  }
  const Tensor* res = results[0];
  EXPECT_LT(max_rel_diff(res[0], rank_rows(o, r, C, s.sc)), 1e-5) << "o rank " << r;
  EXPECT_LT(max_rel_diff(res[1], rank_lse(lse, r, C, s.sc)), 1e-5) << "lse rank " << r;
  EXPECT_LT(max_rel_diff(res[2], rank_rows(dq, r, C, s.sc)), 1e-5) << "dq rank " << r;
  EXPECT_LT(max_rel_diff(res[3], rank_rows(dk, r, C, s.sc)), 1e-5) << "dk rank " << r;
  EXPECT_LT(max_rel_diff(res[4], rank_rows(dv, r, C, s.sc)), 1e-5) << "dv rank " << r;
  for (int i = 0; i < 5; i++) EXPECT_TRUE(testing::bitwise_equal(results[0][i], results[1][i])) << "rerun " << i;
}

const CpCommType kTypes[] = {CpCommType::P2P, CpCommType::A2A, CpCommType::AllGather, CpCommType::A2AP2P};

TEST(ContextAttention, EveryCommTypeMatchesTheSingleRankKernel) {
  for (CpCommType t : kTypes) check(t, {20, 2, 4, 4, 8}, false);
}

TEST(ContextAttention, GqaAndChunksAcrossTiles) {
  // 4 query heads on 1 kv head: a2a repeats the kv head; chunks of 70 rows cross a tile boundary.
  for (CpCommType t : kTypes) check(t, {70, 1, 4, 1, 8}, false);
  for (CpCommType t : kTypes) check(t, {12, 2, 4, 2, 16}, false);
}

TEST(ContextAttention, DropoutKeyedByGlobalPositionsAndHeads) {
  for (CpCommType t : kTypes) check(t, {20, 2, 4, 2, 8}, true);
}

TEST(ContextAttention, A2aRefusesHeadsNotDividingTheGroup) {
  const ProcessGroup w = ProcessGroup::world();
  nn::ContextParallel cp;
  cp.group = &w;
  cp.size = w.size();
  cp.rank = w.rank();
  cp.comm_type = CpCommType::A2A;
  const int64_t N = w.size() + 1;
  Tensor q = testing::randn({8, 1, N, 4}, DType::F32, 1);
  Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({1, N, 8}, DType::F32);
  const std::string err = testing::user_error_of([&] { nn::context_attention_forward(q, q, q, 0.5, cp, o, lse); });
  EXPECT_NE(err.find("--cp-comm-type a2a"), std::string::npos) << err;
}

}  // namespace
}  // namespace moecore
