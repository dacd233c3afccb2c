// `moecore bench memory`: for one model (the bench train model under the user's flags), peak activation memory and
// step time with no recompute, each selective recompute module that applies, and full recompute, in one run: what
// each option saves and what it costs. The step's memory: the allocator's peak over the timed steps less what stays
// live between steps (weights, gradients, optimizer state), beside the memory plan's figure for what a step
// allocates and frees (train/memory_plan.h, MemoryPlan::transient: activations at the schedule's peak and the
// backward's working set).
#include <fmt/format.h>

#include <cstdio>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"

namespace moecore::cli {

namespace {

constexpr const char* kModel =
    "--normalization RMSNorm --position-embedding-type rope "
    "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --group-query-attention --num-query-groups 4 "
    "--swiglu --disable-bias-linear --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 "
    "--moe-aux-loss-coeff 1e-2 --seq-length 256 --micro-batch-size 4 --global-batch-size 8 --vocab-size 32000";

void run_bench_memory(const TrainBenchArgs& a) {
  const std::vector<std::string> base = bench_model_flags(a, kModel);
  const train::TrainConfig c0 = train::parse_train_config(base);
  std::vector<std::pair<std::string, std::vector<std::string>>> options = {{"none", {}}};
  std::vector<std::string> modules = {"core_attn", "layernorm"};
  if (c0.num_experts > 0) modules.insert(modules.end(), {"moe_act", "moe"});
  if (std::find(c0.is_moe_layer.begin(), c0.is_moe_layer.end(), false) != c0.is_moe_layer.end())
    modules.push_back("mlp");  // a dense layer
  if (c0.moe_shared_expert_intermediate_size > 0) modules.push_back("shared_experts");
  if (c0.multi_latent_attention) modules = {"moe_act", "moe", "mlp"};
  for (const std::string& m : modules)
    options.push_back({"selective " + m, {"--recompute-granularity", "selective", "--recompute-modules", m}});
  options.push_back(
      {"full (uniform, 1 layer)",
       {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}});
  // Each row is printed as soon as it is measured (a run of the default model takes minutes per option).
  std::FILE* out = stdout;
  double none_peak = 0, none_step = 0;
  for (size_t k = 0; k < options.size(); k++) {
    const auto& [name, extra] = options[k];
    const train::TrainConfig c = train::parse_train_config(train::override_flags(base, extra));
    std::unique_ptr<train::Trainer> t;
    Allocator::instance().reset_peak();
    const TrainRun r = timed_train(c, a.iters, t);
    const AllocatorStats s = Allocator::instance().stats();
    const train::MemoryPlan p =
        train::plan_memory(c, train::build_vocabulary(c).padded, train::PlanLayout::from(c, r.world), 0);
    const double peak = static_cast<double>(s.peak_bytes - s.live_bytes), step = r.step_median_s;
    if (k == 0) none_peak = peak, none_step = step;
    if (r.rank != 0) continue;
    if (k == 0) {
      fmt::print(
          out,
          "moecore bench memory: {} layers, H={}, {} experts top-{} (F={}), S={}, micro-batch {}, {}, {} threads\n",
          c0.num_layers, c0.hidden_size, c0.num_experts, c0.moe_router_topk, c0.moe_ffn_hidden_size, c0.seq_length,
          c0.micro_batch_size, a.dtype, num_threads());
      fmt::print(out, "{:<26} {:>14} {:>10} {:>14} {:>10} {:>10}\n", "recompute", "step peak MiB", "saved MiB",
                 "plan MiB", "step s", "time +%");
    }
    fmt::print(out, "{:<26} {:>14.1f} {:>10.1f} {:>14.1f} {:>10.3f} {:>+10.1f}\n", name, peak / 0x1p20,
               (none_peak - peak) / 0x1p20, p.transient() / 0x1p20, step, 100.0 * (step / none_step - 1.0));
    std::fflush(out);
  }
}

}  // namespace

BenchCommand add_memory_bench(CLI::App& bench) {
  TrainBenchArgs d;
  d.iters = 2;
  return add_training_bench(bench, "memory",
                            "Peak activation memory and step time per recompute option (none, each selective "
                            "module, full): MiB saved, % time added",
                            d, run_bench_memory);
}

}  // namespace moecore::cli
