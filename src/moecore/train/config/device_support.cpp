// Training device choice (see device_support.h).
#include "moecore/train/config/device_support.h"

#include <fmt/format.h>

#include "moecore/core/error.h"
#include "moecore/device/device_select.h"
#include "moecore/kernels/dropout_philox.h"

namespace moecore::train {

std::string gpu_training_gap(const TrainConfig& c) {
  auto gap = [](const std::string& what) { return what + " is not supported by moecore on the GPU yet"; };
  // The GPU's dropout kernels carry the micro-batch's sample indices in their launch arguments.
  if ((c.hidden_dropout > 0 || c.attention_dropout > 0) && c.micro_batch_size > kernels::dropout_philox::kMaxGpuSamples)
    return gap(fmt::format("dropout with --micro-batch-size {} (above {}: use smaller micro-batches)",
                           c.micro_batch_size, kernels::dropout_philox::kMaxGpuSamples));
  if (c.optimizer != "adam") return gap("--optimizer " + c.optimizer);
  if (c.use_precision_aware_optimizer) return gap("--use-precision-aware-optimizer");
  if (c.log_num_zeros_in_grad) return gap("--log-num-zeros-in-grad");
  for (const std::string& t : c.moe_router_load_balancing_type)
    if (c.num_experts > 0 && t == "sinkhorn") return gap("--moe-router-load-balancing-type sinkhorn");
  if (c.num_experts > 0 && c.moe_router_dtype == "fp64") return gap("--moe-router-dtype fp64");
  if (c.num_experts > 0 && c.moe_router_topk > 64)  // the GPU permutation sorts a token's rows in registers
    return gap(fmt::format("--moe-router-topk {} (above 64)", c.moe_router_topk));
  return "";
}

Device training_device(const TrainConfig& c, std::string* why_cpu) {
  const Device d = cuda::resolve_device(c.device, "train");
  if (!d.is_cuda()) return d;
  const std::string gap = gpu_training_gap(c);
  if (gap.empty()) return d;
  MOE_CHECK(c.device == "auto", "--device {}: {}; use --device cpu", c.device, gap);
  if (why_cpu) *why_cpu = gap;
  return Device::cpu();
}

}  // namespace moecore::train
