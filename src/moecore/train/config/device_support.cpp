// Training device choice (see device_support.h).
#include "moecore/train/config/device_support.h"

#include <fmt/format.h>

#include "moecore/core/error.h"
#include "moecore/kernels/dropout_philox.h"
#include "moecore/train/config/optimizer_config.h"

namespace moecore::train {

std::string gpu_training_gap(const TrainConfig& c) {
  auto gap = [](const std::string& what) { return what + " is not supported by moecore on the GPU yet"; };
  // The GPU's dropout kernels carry the micro-batch's sample indices in their launch arguments.
  if ((c.hidden_dropout > 0 || c.attention_dropout > 0) && c.micro_batch_size > kernels::dropout_philox::kMaxGpuSamples)
    return gap(fmt::format("dropout with --micro-batch-size {} (above {}: use smaller micro-batches)",
                           c.micro_batch_size, kernels::dropout_philox::kMaxGpuSamples));
  // The GPU router computes in f32 (docs/differences.md).
  if (c.num_experts > 0 && c.moe_router_dtype == "fp64") return gap("--moe-router-dtype fp64");
  // The flex dispatcher's exchanges (moe/flex_dispatcher.h) are host code; one EP rank permutes locally either way.
  if (c.num_experts > 0 && c.moe_token_dispatcher_type == "flex" && c.expert_model_parallel_size > 1)
    return gap("--moe-token-dispatcher-type flex (the flex dispatcher, DeepEP/HybridEP semantics) with expert "
               "parallelism") +
           " (--moe-token-dispatcher-type alltoall computes the same math on the GPU)";
  // The combined schedule's fiber switch (core/fiber.h) interleaves host code; the GPU has no second stream for it.
  if (combined_1f1b(c))
    return "--overlap-moe-expert-parallel-comm without --delay-wgrad-compute (Megatron's combined 1F1B schedule) is "
           "CPU-only in moecore; the GPU refuses it: add --delay-wgrad-compute";
  // Megatron FSDP's unit gathers and gradient shards are host-side (optim/fsdp.h).
  if (c.use_megatron_fsdp) return gap("--use-megatron-fsdp (Megatron FSDP)");
  // FP8 weights (and their FP8 all-gathers) exist only in the CPU emulation (nn/fp8_param.h).
  if (c.fp8_param_gather)
    return "--fp8-param-gather: FP8 primary weights are CPU-only in moecore (the CPU emulates them exactly); the GPU "
           "refuses them";
  // FP8 GEMMs are emulated on the CPU only (kernels/fp8.h); refused before any work.
  if (!c.fp8_format.empty())
    return "--fp8-format " + c.fp8_format +
           ": FP8 training is CPU-only in moecore (the CPU emulates the recipes exactly); the GPU refuses it";
  // fp16's kernels (f16 operands widened to f32) exist on the CPU only.
  if (c.fp16) return "--fp16: fp16 training is CPU-only in moecore; the GPU refuses it";
  // fp16/bf16 main gradients are rounded and reduced on the host (optim/low_precision_grads.h).
  if (grad_precision(c).low())
    return gap(
        "bf16 main gradients (--grad-reduce-in-bf16, --main-grads-dtype bf16, or Megatron FSDP's "
        "--megatron-fsdp-main-grads-dtype/--megatron-fsdp-grad-comm-dtype other than fp32)");
  // Loss scaling reads the gradient norm on the host and skips steps there (optim/grad_scaler.h).
  if (c.loss_scale > 0) return gap("loss scaling (--loss-scale)");
  return "";
}

Device training_device(const TrainConfig& c, const device::DeviceAvailability& available) {
  const Device d = device::resolve_device(c.device, "train", available);
  if (!d.is_cuda()) return d;
  const std::string gap = gpu_training_gap(c);
  MOE_CHECK(gap.empty(), "--device {}: {}; {}", c.device, gap,
            c.device == "auto" ? "a GPU is visible, so --device auto trains on it and does not fall back to the CPU: "
                                 "pass --device cpu to train on the CPU"
                               : "use --device cpu");
  return d;
}

bool offloading_applies(Device d) {
  return d.is_cuda();
}

Device training_device(const TrainConfig& c) {
  return training_device(
      c, c.plan_only ? device::DeviceAvailability::assumed_for(c.device) : device::DeviceAvailability::probe());
}

}  // namespace moecore::train
