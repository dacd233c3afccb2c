// Fine-grained activation offloading on the GPU (train/activation_offload.h): the --offload-modules' stash tensors go
// to pinned host memory on a copy stream and come back before backward; the runs' losses, grad norms and parameters
// are bitwise those without offloading (MoE f32 and bf16, MLA, selective recompute, no copies in flight), every host
// block comes back, and the GPU allocator's live bytes after a forward drop by the bytes copied (the plan's count
// within its CPU-layout estimate). Without a GPU each test is skipped with a one-line reason.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "gpu_util.h"
#include "moecore/device/offload_copy.h"
#include "moecore/device/runtime.h"
#include "moecore/train/activation_offload.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

const Args kCudaOffloadAll = testing::offload_all_modules_flags() + Args{"--device", "cuda"};

Args cuda_offload_run() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(64, 2, 4, 64, 3, "1e-2");
}

struct CudaOffloadRun {
  std::vector<train::StepResult> steps;
  std::vector<Tensor> params;
  int64_t offloaded = 0, host_live = 0;
};

CudaOffloadRun cuda_offload_train_run(const Args& base, const Args& extra) {
  const train::TrainConfig c = testing::small_config(base, extra);
  std::FILE* null = std::fopen("/dev/null", "w");
  CudaOffloadRun r;
  {
    train::Trainer t(c, null, false);
    for (int s = 0; s < 3; s++) r.steps.push_back(t.train_step());
    for (const auto& p : t.params().all()) r.params.push_back(p->value.to(Device::cpu()));
    if (t.activation_offload()) {
      r.offloaded = t.activation_offload()->offloaded_bytes();
      r.host_live = t.activation_offload()->host_live_bytes();
    }
  }
  std::fclose(null);
  return r;
}

// The device layer alone: a tensor to pinned memory and back on the copy stream, ordered by tickets only (no host
// synchronisation until the check), comes back with its bits, also when the compute stream queued work before.
TEST(CudaOffload, CopyStreamRoundTrip) {
  MOE_REQUIRE_GPU();
  const Device g = Device::cuda(0);
  Tensor x = Tensor::empty({1000, 33}, DType::F32);
  for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] = static_cast<float>(i % 977) * 0.5f - 3.0f;
  const Tensor d = x.to(g);
  device::OffloadCopyStream copies;
  void* host = device::pinned_allocate(d.nbytes());
  copies.wait_for_current();
  copies.copy(host, d.raw(), d.nbytes());
  const int64_t out = copies.record();
  Tensor back = Tensor::empty(d.shape(), d.dtype(), g);
  copies.current_waits(out);
  copies.release(out);
  copies.wait_for_current();
  copies.copy(back.raw(), host, d.nbytes());
  const int64_t in = copies.record();
  copies.current_waits(in);
  copies.release(in);
  EXPECT_TRUE(testing::bitwise_equal(back.to(Device::cpu()), x));
  copies.synchronize();
  device::pinned_free(host);
}

TEST(CudaOffload, BitwiseLikeNoOffload) {
  MOE_REQUIRE_GPU();
  const std::vector<std::pair<std::string, Args>> cases = {
      {"MoE f32", {}},
      {"MoE bf16", {"--bf16"}},

      {"selective recompute", {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe_act"}},
      {"inflight 0", {"--fine-grained-offloading-max-inflight-offloads", "0"}},
      {"MLA", Args{"--hidden-size", "64"} + testing::small_mla_flags(true)},
  };
  for (const auto& [what, extra] : cases) {
    const CudaOffloadRun a = cuda_offload_train_run(cuda_offload_run(), extra + Args{"--device", "cuda"});
    const CudaOffloadRun b = cuda_offload_train_run(cuda_offload_run(), extra + kCudaOffloadAll);
    EXPECT_GT(b.offloaded, 0) << what;
    EXPECT_EQ(b.host_live, 0) << what;
    for (size_t s = 0; s < a.steps.size(); s++) {
      EXPECT_EQ(a.steps[s].lm_loss, b.steps[s].lm_loss) << what << " step " << s;
      EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << what << " step " << s;
    }
    ASSERT_EQ(a.params.size(), b.params.size());
    for (size_t i = 0; i < a.params.size(); i++)
      EXPECT_TRUE(testing::bitwise_equal(a.params[i], b.params[i])) << what << " parameter " << i;
  }
}

int64_t cuda_live_after_forward(const train::TrainConfig& c, train::ActivationOffload* off) {
  nn::ParamRegistry reg;
  const train::ParallelGroups g(c, nullptr);
  const auto model = train::build_model(c, train::build_vocabulary(c).padded, reg, g);
  reg.to(Device::cuda(0));
  if (off) model->set_stash_offload(off);
  Tensor tokens = Tensor::empty({c.micro_batch_size, c.seq_length}, DType::I64);
  for (int64_t i = 0; i < tokens.numel(); i++) tokens.data<int64_t>()[i] = (i * 7 + 3) % 60;
  nn::GPTModel::Stash st = model->make_stash();
  const int64_t before = device::device_allocator_stats(Device::cuda(0)).live_bytes;
  model->forward(tokens, tokens, Tensor(), st);
  if (off) off->drain();
  device::synchronize();
  return device::device_allocator_stats(Device::cuda(0)).live_bytes - before;
}

TEST(CudaOffload, DeviceBytesDropByTheCopiedBytes) {
  MOE_REQUIRE_GPU();
  const train::TrainConfig plain = testing::small_config(cuda_offload_run(), {"--device", "cuda"});
  const train::TrainConfig c = testing::small_config(cuda_offload_run(), kCudaOffloadAll);
  cuda_live_after_forward(plain, nullptr);  // once first: the kernels' caches filled
  const int64_t base = cuda_live_after_forward(plain, nullptr);
  train::ActivationOffload off(train::offload_config(c, Device::cuda(0)), Device::cuda(0));
  const int64_t live = cuda_live_after_forward(c, &off);
  const double copied = static_cast<double>(off.offloaded_bytes());
  EXPECT_GT(copied, 0);
  // The GPU allocator's blocks are rounded up (512 bytes at least): the drop is the copied bytes and the rounding.
  EXPECT_GE(static_cast<double>(base - live), copied);
  EXPECT_LE(static_cast<double>(base - live), 1.25 * copied + 64 * 1024);
  const train::MemoryPlan p = train::plan_memory(c, train::build_vocabulary(c).padded, train::PlanLayout::from(c), 0);
  EXPECT_NEAR(p.offloaded, copied, 0.5 * copied);  // the plan lays the tensors out as the CPU does
  EXPECT_GT(off.host_pool_bytes(), 0);
}

}  // namespace
}  // namespace moecore
