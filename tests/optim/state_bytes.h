// What the bytes-per-parameter tests share: a model and its ChainedOptimizer built from flags as the trainer builds
// them, and the allocator's live bytes they hold, beside Megatron's mixed-precision layout counted per parameter
// (bf16 weights, fp32 main gradients, fp32 master weights and Adam moments in the optimizer, sharded under the
// distributed optimizer) and the memory plan's state bytes.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/allocator.h"
#include "moecore/optim/chained_optimizer.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/parallel_groups.h"

namespace moecore::testing {

struct StateBytes {
  double params = 0;       // parameters on this rank
  double bf16_params = 0;  // of them: stored in bf16 (f16 under --fp16) by the model
  double measured = 0;     // the allocator's live bytes held by the model and its optimizer
  double expected = 0;     // the layout's, parameter by parameter (below)
  double planned = 0;      // the plan's weights + gradients + moments + master weights
};

// Megatron's bytes for one parameter: its value (2 in bf16, else 4), its fp32 main gradient (4), and in the
// optimizer the fp32 master of a bf16 parameter (4) and both fp32 moments (8), divided over `shards` ranks under
// the distributed optimizer.
inline double layout_bytes(bool bf16, double shards) {
  return (bf16 ? 2.0 : 4.0) + 4.0 + ((bf16 ? 4.0 : 0.0) + 8.0) / shards;
}

// `c` (resolved here, on the CPU) built on `world` (null: one process).
inline StateBytes state_bytes(train::TrainConfig c, const comm::ProcessGroup* world) {
  c.device = "cpu";
  train::resolve(c);
  const int64_t padded = train::build_vocabulary(c).padded;
  train::ParallelGroups g(c, world);
  Allocator& a = Allocator::instance();
  StateBytes s;
  const int64_t before = a.stats().live_bytes;
  {
    nn::ParamRegistry reg;
    auto model = train::build_model(c, padded, reg, g);
    std::vector<nn::Parameter*> params;
    for (auto& p : reg.all()) params.push_back(p.get());
    const size_t layers = static_cast<size_t>(c.num_layers);
    const optim::OptimizerGroups og{g.dp.get(), g.edp.get(), g.tp.get(), g.world.get(), g.etp.get()};
    const optim::OptimizerConfig oc = train::optimizer_config(c);
    optim::ChainedOptimizer opt(
        params, layers + 1, [layers](const nn::Parameter& p) { return train::layer_of(p, layers); }, og, oc);
    s.measured = static_cast<double>(a.stats().live_bytes - before);
    const bool sharded = opt.distributed();
    for (auto* p : params) {
      const auto n = static_cast<double>(p->value.numel());
      const bool b16 = is_half(p->value.dtype());  // bf16 (or f16 under --fp16)
      const double shards = !sharded ? 1.0 : static_cast<double>(p->expert_parallel ? g.edp->size() : g.dp->size());
      s.params += n;
      s.bf16_params += b16 ? n : 0.0;
      s.expected += n * layout_bytes(b16, shards);
    }
  }
  const train::MemoryPlan m =
      train::plan_memory(c, padded, train::PlanLayout::from(c, world ? world->size() : 1), g.pp_rank);
  s.planned = m.weights + m.grads + m.adam + m.master;
  return s;
}

// The measured bytes per parameter within `rel` of the layout's (allocator size classes, the buckets' padding and
// the model's few non-parameter tensors), and the plan within `rel` of both.
inline void expect_layout(const StateBytes& s, const std::string& what, double rel) {
  ASSERT_GT(s.params, 0) << what;
  ASSERT_GT(s.bf16_params, 0.9 * s.params) << what << ": most parameters are GEMM weights, stored in bf16 (f16)";
  std::printf(
      "%s: %.3f bytes per parameter measured, %.3f by the layout, %.3f planned (%.0f parameters, %.1f%% 16-bit)\n",
      what.c_str(), s.measured / s.params, s.expected / s.params, s.planned / s.params, s.params,
      100.0 * s.bf16_params / s.params);
  EXPECT_NEAR(s.measured, s.expected, rel * s.expected) << what;
  EXPECT_NEAR(s.planned, s.expected, rel * s.expected) << what;
}

// The model both measure: two layers (one dense FFN width, four experts top-2), SwiGLU, no biases, untied.
inline std::vector<std::string> state_bytes_model() {
  return std::vector<std::string>{"--num-layers",
                                  "2",
                                  "--hidden-size",
                                  "128",
                                  "--ffn-hidden-size",
                                  "256",
                                  "--num-attention-heads",
                                  "4",
                                  "--swiglu",
                                  "--disable-bias-linear",
                                  "--num-experts",
                                  "4",
                                  "--moe-router-topk",
                                  "2",
                                  "--moe-ffn-hidden-size",
                                  "256",
                                  "--untie-embeddings-and-output-weights"} +
         rmsnorm_rope_flags() + mock_run_flags(32, 2, 4, 128, 3, "1e-3");
}

}  // namespace moecore::testing
