// Megatron FSDP's bytes in the memory plan (see memory_plan.h, apply_fsdp): the state each
// --data-parallel-sharding-strategy keeps on a rank and the units' whole parameters and gradients a step holds at
// once (optim/distributed_optimizer_fsdp.cpp: a unit's gradients live from its backward's start until the next
// unit's backward ends, its reduce-scatter in flight meanwhile; a unit's parameters while a forward or backward reads
// them, the next unit's gather posted beside, in a full-recompute chunk's replay too).
#include <algorithm>

#include "moecore/train/memory_plan.h"

namespace moecore::train {

void apply_fsdp(const TrainConfig& c, const PlanLayout& l, const ParamCounts& p, MemoryPlan& m) {
  if (!c.use_megatron_fsdp || l.world() <= 1) return;
  const std::string& s = c.data_parallel_sharding_strategy;
  const bool low = low_precision(c).has_value();  // --bf16 or --fp16: the same bytes
  const double n = p.dense + p.expert, n32 = low ? p.f32_dense + p.f32_expert : n, n16 = n - n32;
  const double dense16 = low ? p.dense - p.f32_dense : 0, expert16 = low ? p.expert - p.f32_expert : 0;
  const bool aware = c.use_precision_aware_optimizer;
  const double moments = (aware && c.exp_avg_dtype == "bf16" ? 2 : 4) + (aware && c.exp_avg_sq_dtype == "bf16" ? 2 : 4);
  // The shard groups: dense over DP×CP, experts over EDP, each divided by --num-distributed-optimizer-instances
  // (HSDP: sharded within an instance, replicated across).
  const double k = static_cast<double>(std::max<int64_t>(1, c.num_distributed_optimizer_instances));
  const double over = static_cast<double>(l.dp * l.cp) / k, edp = static_cast<double>(l.edp) / k;
  auto shard = [&](double dense, double expert) { return dense / over + expert / edp; };
  // --fp8-param-gather: FP8 weights have f32 masters apart without --bf16 too (memory_plan.cpp).
  const double fp8_master16 = low ? 0 : 1;
  if (s == "no_shard") {  // plain data parallelism: everything whole
    m.adam = moments * n;
    m.master = 4 * (n16 + fp8_master16 * (p.fp8_dense + p.fp8_expert));
    return;
  }
  // --outer-dp-sharding-strategy optim: the state sharded across the instances too.
  const double outer = k > 1 && c.outer_dp_sharding_strategy == "optim" ? k : 1;
  m.adam = moments * shard(p.dense, p.expert) / outer;
  m.master = 4 * (shard(dense16, expert16) + fp8_master16 * shard(p.fp8_dense, p.fp8_expert)) / outer;
  if (s == "optim") return;
  // optim_grads: the owned gradient shard, and whole gradients for the unit in backward and the one reducing (the
  // embedding/output unit's for the whole backward where a stage holds both ends).
  m.grads = 4 * shard(p.dense, p.expert);
  m.fsdp_units = 4 * (2 * p.largest_layer + p.ends);
  if (s != "optim_grads_params") return;
  // optim_grads_params: the owned parameter shard in its storage dtype, and the gathered units.
  const double dense32 = p.dense - dense16, expert32 = p.expert - expert16;
  // FP8 weights (--fp8-param-gather): their owned shard as f32 read-backs and FP8 bytes, 5 bytes an element; a
  // gathered unit's as f32 read-backs beside the gathered bytes.
  const double fp8_extra = low ? 3 : 1;
  m.weights =
      2 * shard(dense16, expert16) + 4 * shard(dense32, expert32) + fp8_extra * shard(p.fp8_dense, p.fp8_expert);
  auto bytes = [&](double all, double f32) { return low ? 2 * (all - f32) + 4 * f32 : 4 * all; };
  const double layer = bytes(p.largest_layer, p.largest_layer_f32) + fp8_extra * p.largest_layer_fp8;
  const double ends = bytes(p.ends, p.ends_f32);
  if (c.fsdp_double_buffer) {  // two buffers per storage dtype and parameter class, each the largest unit's size
    m.comm += 2 * (layer + ends);
    return;
  }
  // A layer and the next one's prefetch (or the ends'); a full-recompute chunk's replay holds one unit at a time.
  m.fsdp_units += std::max(2 * layer, layer + ends);
}

}  // namespace moecore::train
