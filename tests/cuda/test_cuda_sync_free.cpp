// The GPU optimizer step without host synchronisation (kernels/grad_clip.h, kernels/cuda/multi_tensor.cu): the
// multi-tensor gradient norm and AdamW with the clip coefficient read from device memory bitwise equal to the
// single-tensor kernels with the host's coefficient; a non-finite gradient skipping the update on the device; a
// training step whose optimizer makes no host synchronisation (counted by the GPU profiler's sync ledger); and
// norms read at the log step equal to norms read every step. Without a GPU each test is skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "config_util.h"
#include "gpu_util.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/grad_clip.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

Tensor gpu_rand(int64_t n, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor h = Tensor::empty({n}, DType::F32);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h.data<float>()[i] = lo + (hi - lo) * static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  }
  return h.to(Device::cuda(0));
}

bool bitwise(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

TEST(CudaSyncFree, MultiTensorNormEqualsTheSingleTensorSums) {
  MOE_REQUIRE_GPU();
  std::vector<Tensor> dense, expert;
  std::vector<double> wd, we;
  for (int k = 0; k < 45; k++) {  // more tensors than one launch
    dense.push_back(gpu_rand(1 + (k * 7919) % 300000, 10 + k));
    wd.push_back(k % 3 ? 1.0 : 0.5);
  }
  for (int k = 0; k < 3; k++) {
    expert.push_back(gpu_rand(4096 * (k + 1), 100 + k));
    we.push_back(0.25);
  }
  double part0 = 0, part1 = 0;  // as the host summed kernels::sum_squares before
  for (size_t k = 0; k < dense.size(); k++) part0 += wd[k] * kernels::sum_squares(dense[k]);
  for (size_t k = 0; k < expert.size(); k++) part1 += we[k] * kernels::sum_squares(expert[k]);
  const double want = (0.0 + part0) + part1;
  kernels::ClipState s = kernels::make_clip_state(Device::cuda(0), 4);
  kernels::squares_reset(s);
  kernels::squares_add_part(s, dense, wd);
  kernels::squares_add_part(s, expert, we);
  EXPECT_EQ(kernels::squares_total(s), want);
  kernels::clip_finish(s, std::nullopt, 1.0, true, 3, /*defer=*/true);
  const kernels::DeferredNorms d = kernels::take_deferred_norms(s);
  ASSERT_EQ(d.norms.size(), 1u);
  EXPECT_EQ(d.norms[0], std::sqrt(want));
  EXPECT_EQ(d.first_nonfinite, 0);
  kernels::AdamWParams hp;
  EXPECT_TRUE(kernels::apply_clip(s, hp, /*host=*/true));
  EXPECT_EQ(hp.grad_scale, 1.0 / (std::sqrt(want) + 1e-6));
}

// AdamW over many tensors (f32 and bf16 moments, a bf16 parameter copy) with the coefficient from device memory,
// against one adamw_step_multi per tensor with the host's coefficient; and a non-finite norm writes nothing.
void adamw_case(bool bf16_moments, bool nonfinite) {
  const Device g = Device::cuda(0);
  const DType md = bf16_moments ? DType::BF16 : DType::F32;
  std::vector<kernels::AdamWTensor> dev, ref;
  std::vector<Tensor> grads;
  for (int k = 0; k < 40; k++) {
    const int64_t n = 1 + (k * 3571) % 20000;
    Tensor p = gpu_rand(n, 200 + k), gr = gpu_rand(n, 300 + k, -3, 3);
    if (nonfinite && k == 17) {
      Tensor h = gr.to(Device::cpu());
      h.data<float>()[n / 2] = NAN;
      gr = h.to(g);
    }
    Tensor m = gpu_rand(n, 400 + k, -0.1f, 0.1f).to(md), v = gpu_rand(n, 500 + k, 0, 0.01f).to(md);
    Tensor pb = k % 2 ? Tensor::zeros({n}, DType::BF16, g) : Tensor();
    const double w = k % 4 ? 0.1 : 0.0;
    dev.push_back({p, gr, m, v, w, pb});
    ref.push_back({p.clone(), gr, m.clone(), v.clone(), w, pb.defined() ? pb.clone() : Tensor()});
    grads.push_back(gr);
  }
  kernels::ClipState s = kernels::make_clip_state(g, 2);
  kernels::squares_reset(s);
  kernels::squares_add_part(s, grads, std::vector<double>(grads.size(), 1.0));
  kernels::clip_finish(s, std::nullopt, 1.0, true, 1, false);
  kernels::AdamWParams hp;
  hp.lr = 1e-2;
  kernels::AdamWParams host = hp;
  const bool applied = kernels::apply_clip(s, host, /*host=*/true);
  EXPECT_EQ(applied, !nonfinite);
  // The gradients' norm is well above 1: clipped. A NaN norm gives no coefficient (NaN < 1 is false), as Megatron's
  // clip_grad_norm: the scale stays 1 and the skip flag keeps the update out.
  if (!nonfinite) EXPECT_LT(host.grad_scale, 1.0);
  if (nonfinite) EXPECT_EQ(host.grad_scale, 1.0);
  ASSERT_TRUE(kernels::apply_clip(s, hp));
  ASSERT_TRUE(hp.clip.defined());
  std::vector<Tensor> before;
  for (auto& t : dev) before.push_back(t.param.clone());
  kernels::adamw_step_multi(dev, hp, 3);
  for (size_t k = 0; k < ref.size() && applied; k++) {
    std::vector<kernels::AdamWTensor> one{ref[k]};
    kernels::adamw_step_multi(one, host, 3);
  }
  for (size_t k = 0; k < dev.size(); k++) {
    EXPECT_TRUE(bitwise(dev[k].param, nonfinite ? before[k] : ref[k].param)) << "tensor " << k;
    EXPECT_TRUE(bitwise(dev[k].m, ref[k].m) && bitwise(dev[k].v, ref[k].v)) << "tensor " << k;
    if (dev[k].param_bf16.defined()) {
      EXPECT_TRUE(bitwise(dev[k].param_bf16, ref[k].param_bf16)) << "tensor " << k;
    }
  }
}

TEST(CudaSyncFree, MultiTensorAdamWReadsTheClipFromTheDevice) {
  MOE_REQUIRE_GPU();
  adamw_case(false, false);
  adamw_case(true, false);
}

TEST(CudaSyncFree, ANonFiniteNormSkipsTheUpdateOnTheDevice) {
  MOE_REQUIRE_GPU();
  adamw_case(false, true);
  adamw_case(true, true);
}

std::vector<std::string> sync_run_args(const std::vector<std::string>& extra) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(32, 2, 4, 64, 10, "1e-2") +
         std::vector<std::string>{"--clip-grad",  "1.0", "--log-interval", "1000",
                                  "--eval-iters", "0",   "--device",       "cuda"} +
         extra;
}

// A step between log lines: no host synchronisation in the optimizer phase (the norm, the clip coefficient, the
// non-finite check and AdamW all on the device), with f32 and bf16 moments and with SGD.
TEST(CudaSyncFree, AnUnloggedStepsOptimizerMakesNoHostSynchronisation) {
  MOE_REQUIRE_GPU();
  std::FILE* null = std::fopen("/dev/null", "w");
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"--bf16", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
       "--use-distributed-optimizer"},
      {"--optimizer", "sgd"}};
  for (const auto& extra : variants) {
    train::Trainer t(train::parse_train_config(sync_run_args(extra)), null, false);
    device::GpuProfiler prof(t.device());
    prof.begin_step();
    t.train_step(false);  // warm-up
    prof.end_step();
    t.settle_norms();
    prof.reset();
    for (int i = 0; i < 3; i++) {
      prof.begin_step();
      t.train_step(false);
      prof.end_step();
      t.settle_norms();
    }
    const device::GpuProfileReport r = prof.report(1000);
    double optimizer_syncs = 0;
    for (const auto& s : r.top_sites) {
      if (s.phase == device::Phase::kOptimizer) optimizer_syncs += s.per_step;
      std::printf("  %5.1f/step %s in %s\n", s.per_step, s.what.c_str(), device::phase_key(s.phase));
    }
    std::printf("%s: %.1f syncs per step, %.1f in the optimizer\n", extra.empty() ? "adamw" : extra[0].c_str(),
                r.syncs_per_step, optimizer_syncs);
    EXPECT_EQ(optimizer_syncs, 0.0);
  }
  std::fclose(null);
}

// The norms read at the log line equal those read every step, bitwise, and the losses too.
TEST(CudaSyncFree, DeferredNormsEqualTheNormsReadEveryStep) {
  MOE_REQUIRE_GPU();
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<double> every, deferred, loss_every, loss_deferred;
  {
    train::Trainer t(train::parse_train_config(sync_run_args({})), null, false);
    for (int i = 0; i < 6; i++) {
      const auto r = t.train_step();
      every.push_back(r.grad_norm);
      loss_every.push_back(r.lm_loss);
    }
  }
  {
    train::Trainer t(train::parse_train_config(sync_run_args({})), null, false);
    for (int i = 0; i < 6; i++) {
      const auto r = t.train_step(false);
      EXPECT_TRUE(r.grad_norm_on_device);
      loss_deferred.push_back(r.lm_loss);
    }
    for (const auto& r : t.settle_norms()) deferred.push_back(r.grad_norm);
  }
  std::fclose(null);
  EXPECT_EQ(every, deferred);
  EXPECT_EQ(loss_every, loss_deferred);
}

// A token id (or a label) outside the vocabulary is not read back when the embedding (the cross-entropy) sees it:
// the record on the device stops every later update, and the log step's read raises the CPU's error naming it.
void bad_id_case(bool label) {
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(train::parse_train_config(sync_run_args({})), null, false);
  t.train_step(false);
  t.settle_norms();
  const int64_t B = 2, S = 32;
  Tensor tokens = Tensor::zeros({B, S}, DType::I64), labels = Tensor::zeros({B, S}, DType::I64);
  Tensor mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; i++) mask.set_item(i, 1.0);
  (label ? labels : tokens).set_item(S + 5, label ? 100001 : 100000);
  auto stash = t.model().make_stash();
  t.model().forward(tokens, labels, mask, stash);  // recorded on the device, nothing raised yet
  std::vector<Tensor> before;
  for (const auto& p : t.params().all()) before.push_back(p->value.to(Device::cpu()));
  t.train_step(false);  // runs, but applies no update: the record set the optimizer's skip flag
  for (size_t i = 0; i < before.size(); i++)
    EXPECT_TRUE(bitwise(before[i], t.params().all()[i]->value)) << t.params().all()[i]->name;
  try {
    t.settle_norms();  // the log step's read
    ADD_FAILURE() << "a bad " << (label ? "label" : "token id") << " was not raised";
  } catch (const Error& e) {
    const std::string want = label ? "label 100001 at position " : "token id 100000 at position ";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("iteration 1: "), std::string::npos) << e.what();
  }
  std::fclose(null);
}

TEST(CudaSyncFree, ABadTokenIdIsRaisedAtTheLogStepNamingIt) {
  MOE_REQUIRE_GPU();
  bad_id_case(false);
  bad_id_case(true);
}

}  // namespace
}  // namespace moecore
