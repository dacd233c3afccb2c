// Context parallelism's attention blocks on the GPU (kernels/attention.h attention_block_forward/backward,
// attention_merge) against the CPU's block form: query rows at q0.., keys at k0.., causal by global position, with
// attention dropout keyed by global positions (so both devices drop the same probabilities), dq accumulated. f32
// through the warp-per-row kernels within 1e-5; bf16 through the tensor-core kernels (D 64/128) and the warp-per-row
// one (D 32) within the bf16 tolerance of test_cuda_attention_tc.cpp; reruns bitwise. The merge kernel against the
// CPU's, and two key blocks merged against the one block. Skipped (one line) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/kernels/attention.h"

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

struct CpBlockCase {
  int64_t Sq, Sk, q0, k0, B, Nq, Nkv, D;
  std::string str() const {
    return "Sq=" + std::to_string(Sq) + "@" + std::to_string(q0) + " Sk=" + std::to_string(Sk) + "@" +
           std::to_string(k0) + " B=" + std::to_string(B) + " " + std::to_string(Nq) + "/" + std::to_string(Nkv) +
           " D=" + std::to_string(D);
  }
};

struct CpBlockOut {
  Tensor o, lse, dq, dk, dv;
};

// One block forward and backward on `dev`; dq starts from a copy of dq0 (the block backward adds to it; `to` on the
// tensor's own device would hand back dq0 itself).
CpBlockOut run_cp_block(const CpBlockCase& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                        const Tensor& dq0, const AttentionDropout* drop, bool bf16, Device dev) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  CpBlockOut r{Tensor::empty(q.shape(), DType::F32, dev), Tensor::empty({c.B, c.Nq, c.Sq}, DType::F32, dev),
               dq0.clone().to(dev), Tensor::empty(k.shape(), DType::F32, dev),
               Tensor::empty(v.shape(), DType::F32, dev)};
  const Tensor tq = q.to(dev), tk = k.to(dev), tv = v.to(dev), td = dout.to(dev);
  attention_block_forward(tq, tk, tv, c.q0, c.k0, scale, r.o, r.lse, drop, bf16);
  attention_block_backward(td, tq, tk, tv, r.o, r.lse, c.q0, c.k0, scale, r.dq, r.dk, r.dv, drop, bf16);
  return r;
}

// Every row of the cases sees at least one key (q0 + i ≥ k0), so lse is finite throughout. `dev`: the GPU, or the
// CPU for the harness's own check.
void cp_blocks_match_the_cpu(bool bf16, Device dev = Device::cuda()) {
  const double tol = bf16 ? 2e-2 : 1e-5;
  const std::vector<int64_t> samples = {11, (int64_t{2} << 32) | 3};
  const std::vector<CpBlockCase> cases =
      bf16 ? std::vector<CpBlockCase>{{64, 64, 128, 0, 1, 2, 1, 64},   // a chunk wholly below the diagonal
                                      {96, 96, 96, 96, 2, 4, 2, 128},  // a diagonal chunk
                                      {40, 120, 80, 0, 1, 8, 1, 64},   // allgather: a chunk against its prefix
                                      {70, 50, 90, 41, 2, 2, 1, 64},   // unaligned, partly masked tiles
                                      {24, 24, 72, 24, 1, 2, 2, 32}}   // warp-per-row bf16
           : std::vector<CpBlockCase>{{32, 32, 64, 0, 2, 2, 1, 32},
                                      {48, 48, 48, 48, 1, 4, 2, 64},
                                      {20, 60, 40, 0, 2, 2, 2, 40},
                                      {37, 29, 60, 33, 1, 2, 1, 24}};
  for (const CpBlockCase& c : cases)
    for (const bool with_dropout : {false, true}) {
      AttentionDropout drop;
      drop.mask = DropoutMask::make(17, 0x4350, 0.1);
      drop.sample_B = samples.data();
      drop.head_offset = 1;
      drop.seq_offset = 5;  // the sequence's position 0 in the mask's coordinates; q0 and k0 are added
      const AttentionDropout* dp = with_dropout ? &drop : nullptr;
      const Tensor q = host_random({c.Sq, c.B, c.Nq, c.D}, 1), k = host_random({c.Sk, c.B, c.Nkv, c.D}, 2);
      const Tensor v = host_random(k.shape(), 3), dout = host_random(q.shape(), 4), dq0 = host_random(q.shape(), 5);
      const CpBlockOut cpu = run_cp_block(c, q, k, v, dout, dq0, dp, bf16, Device::cpu());
      const CpBlockOut g = run_cp_block(c, q, k, v, dout, dq0, dp, bf16, dev);
      const std::string what = c.str() + (bf16 ? " bf16" : " f32") + (with_dropout ? " dropout" : "");
      EXPECT_LT(rel_diff(g.o, cpu.o), tol) << what << ": o";
      EXPECT_LT(rel_diff(g.lse, cpu.lse), tol) << what << ": lse";
      EXPECT_LT(rel_diff(g.dq, cpu.dq), tol) << what << ": dq (accumulated)";
      EXPECT_LT(rel_diff(g.dk, cpu.dk), tol) << what << ": dk";
      EXPECT_LT(rel_diff(g.dv, cpu.dv), tol) << what << ": dv";
      const CpBlockOut again = run_cp_block(c, q, k, v, dout, dq0, dp, bf16, dev);
      EXPECT_TRUE(bitwise_equal(dq0, host_random(q.shape(), 5))) << what << ": the runs changed their dq0";
      EXPECT_TRUE(bitwise_equal(again.o, g.o) && bitwise_equal(again.dq, g.dq) && bitwise_equal(again.dk, g.dk) &&
                  bitwise_equal(again.dv, g.dv))
          << what << ": rerun";
    }
}

// The harness on the CPU against itself, everywhere (no GPU needed): every output equal, and no run changes its
// inputs (a dq0 accumulated into in place would make every later run start from the wrong dq).
TEST(CudaContextAttention, HarnessOnTheCpuMatchesItself) {
  cp_blocks_match_the_cpu(false, Device::cpu());
  cp_blocks_match_the_cpu(true, Device::cpu());
}

TEST(CudaContextAttention, BlocksF32MatchTheCpu) {
  MOE_REQUIRE_GPU();
  cp_blocks_match_the_cpu(false);
}

TEST(CudaContextAttention, BlocksBf16MatchTheCpu) {
  MOE_REQUIRE_GPU();
  cp_blocks_match_the_cpu(true);
}

// The merge kernel against the CPU's on the same partial results (rows with either side −inf included), and the
// keys of one block split in two, each block on the GPU, merged: the one block's o and lse.
TEST(CudaContextAttention, MergeMatchesTheCpuAndTheWholeBlock) {
  MOE_REQUIRE_GPU();
  const int64_t S = 40, B = 2, N = 3, D = 32;
  const double inf = std::numeric_limits<double>::infinity();
  Tensor o = host_random({S, B, N, D}, 7), op = host_random(o.shape(), 8);
  Tensor l = host_random({B, N, S}, 9, 3.0), lp = host_random(l.shape(), 10, 3.0);
  // Rows of the left side and of the part that saw no key.
  for (int64_t s = 0; s < 4; s++) {
    l.data<float>()[s] = static_cast<float>(-inf);
    lp.data<float>()[S + s] = static_cast<float>(-inf);
  }
  Tensor go = o.to(Device::cuda()), gl = l.to(Device::cuda());
  attention_merge(go, gl, op.to(Device::cuda()), lp.to(Device::cuda()));
  attention_merge(o, l, op, lp);
  EXPECT_LT(rel_diff(go, o), 1e-6) << "merged o";
  const Tensor hl = gl.to(Device::cpu());
  for (int64_t x = 0; x < l.numel(); x++) {
    const float a = hl.data<float>()[x], b = l.data<float>()[x];
    EXPECT_TRUE(a == b || std::fabs(a - b) <= 1e-6f * std::fabs(b)) << "lse " << x << ": " << a << " vs " << b;
  }

  // Keys [0, 48) at positions 0.. split at 20: two blocks merged against the one.
  const int64_t Sq = 32, Sk = 48, q0 = 40, ks = 20, Nq = 2, Nkv = 1;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Tensor q = host_random({Sq, B, Nq, D}, 11).to(Device::cuda());
  const Tensor k = host_random({Sk, B, Nkv, D}, 12).to(Device::cuda()),
               v = host_random(k.shape(), 13).to(Device::cuda());
  Tensor whole_o = Tensor::empty(q.shape(), DType::F32, Device::cuda());
  Tensor whole_l = Tensor::empty({B, Nq, Sq}, DType::F32, Device::cuda());
  attention_block_forward(q, k, v, q0, 0, scale, whole_o, whole_l);
  Tensor o1 = Tensor::empty(q.shape(), DType::F32, Device::cuda()),
         l1 = Tensor::empty(whole_l.shape(), DType::F32, Device::cuda());
  Tensor o2 = Tensor::empty(q.shape(), DType::F32, Device::cuda()),
         l2 = Tensor::empty(whole_l.shape(), DType::F32, Device::cuda());
  attention_block_forward(q, k.slice(0, ks), v.slice(0, ks), q0, 0, scale, o1, l1);
  attention_block_forward(q, k.slice(ks, Sk - ks), v.slice(ks, Sk - ks), q0, ks, scale, o2, l2);
  attention_merge(o1, l1, o2, l2);
  EXPECT_LT(rel_diff(o1, whole_o), 1e-5) << "two blocks merged: o";
  EXPECT_LT(rel_diff(l1, whole_l), 1e-5) << "two blocks merged: lse";
}

}  // namespace
}  // namespace moecore::kernels
