// `moecore plan` (see plan_command.h).
#include "moecore/cli/plan_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>

#include "moecore/core/error.h"
#include "moecore/device/caching_allocator.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/observe/metrics.h"
#include "moecore/train/plan/gpu_specs.h"
#include "moecore/train/plan/layout_search.h"
#include "moecore/train/plan/step_time.h"

namespace moecore::cli {

namespace {

using train::MemoryPlan;
using train::PlanLayout;
using train::TrainConfig;

std::string gib(double b) {
  return b >= 0x1p30 ? fmt::format("{:.2f} GiB", b / 0x1p30) : train::human_bytes(b);
}

std::string describe_layout(const TrainConfig& c, const PlanLayout& l) {
  std::string v = c.num_virtual_stages_per_pipeline_rank > 1
                      ? fmt::format(" (x{} virtual)", c.num_virtual_stages_per_pipeline_rank)
                      : std::string();
  if (v.empty() && c.num_layers_per_virtual_pipeline_stage > 0 && l.pp > 1)
    v = fmt::format(" ({} layers per virtual stage)", c.num_layers_per_virtual_pipeline_stage);
  return fmt::format(
      "{} ranks: TP {} x CP {} x PP {}{} x DP {}; experts EP {} x ETP {} x EDP {}; {} micro-batches of "
      "{} x {} tokens per step",
      l.world(), l.tp, l.cp, l.pp, v, l.dp, l.ep, l.etp, l.edp, l.num_microbatches, c.micro_batch_size, c.seq_length);
}

// The worst pipeline stage's plan of `c` on `world` ranks.
MemoryPlan worst(const TrainConfig& c, int64_t padded_vocab, int64_t world) {
  return train::worst_stage(train::plan_memory_stages(c, padded_vocab, PlanLayout::from(c, world)));
}

// The worst rank's lines, in the order printed.
std::vector<std::pair<std::string, double>> rows_of(const TrainConfig& c, const MemoryPlan& w) {
  return {
      {c.bf16 ? "weights (bf16; f32 kept)" : (c.fp16 ? "weights (fp16; f32 kept)" : "weights (f32)"), w.weights},
      {"bf16 copies per step", w.bf16_weights},
      {"  of which packed experts", w.packed_weights},
      {"gradients (f32 buckets)", w.grads},
      {"Adam moments", w.adam},
      {c.use_distributed_optimizer ? "f32 master shard" : "f32 master weights", w.master},
      {c.fsdp_double_buffer ? "pipeline / FSDP buffers" : "pipeline send/receive", w.comm},
      {"FSDP units in flight", w.fsdp_units},
      {"activations", w.peak_activations - w.logits},
      {"  of which offload window", w.offload_window},
      {"logits", w.logits},
      {"backward working set", w.working},
  };
}

// A GPU plan made on any machine: the lines where a CPU run of the same flags would plan differently (the CPU's
// packed expert copies, its bf16 kernels' temporaries), and the GPU allocator's rounding.
void print_gpu_differences(std::FILE* out, const TrainConfig& c, int64_t padded_vocab, int64_t world,
                           const MemoryPlan& gpu) {
  TrainConfig cpu_cfg = c;
  cpu_cfg.device = "cpu";
  const MemoryPlan cpu = worst(cpu_cfg, padded_vocab, world);
  fmt::print(out,
             "planned for the GPU (--device {}: no GPU is needed to plan); a CPU run of the same flags plans {}{}\n",
             c.device, gib(cpu.total()),
             cpu.pp_rank == gpu.pp_rank ? "" : fmt::format(" (worst: pipeline stage {})", cpu.pp_rank));
  const auto g = rows_of(c, gpu), h = rows_of(c, cpu);
  for (size_t i = 0; i < g.size(); i++)
    if (std::abs(g[i].second - h[i].second) >= 0.5 * 0x1p20)
      fmt::print(out, "  {:<26} GPU {:>12}   CPU {:>12}\n", g[i].first, gib(g[i].second), gib(h[i].second));
  fmt::print(out,
             "  the GPU's caching allocator rounds each block to the CPU allocator's size classes with a "
             "{}-byte minimum (device/caching_allocator.h)\n",
             device::CachingAllocator::kMinimumBlock);
}

void print_plan(std::FILE* out, const TrainConfig& c, int64_t padded_vocab, int64_t world) {
  const PlanLayout l = PlanLayout::from(c, world);
  const std::vector<MemoryPlan> stages = train::plan_memory_stages(c, padded_vocab, l);
  const MemoryPlan& w = train::worst_stage(stages);
  const train::ParamCounts all = train::count_params(c, padded_vocab, 1, 1);
  fmt::print(out, "moecore plan: {}\n", describe_layout(c, l));
  fmt::print(out, "parameters: {:.2f} B ({:.2f} B in routed experts); vocabulary padded to {}; {}{}\n",
             (all.dense + all.expert) / 1e9, all.expert / 1e9, padded_vocab,
             c.bf16 ? "bf16" : (c.fp16 ? "fp16" : "fp32"),
             c.use_megatron_fsdp           ? ", Megatron FSDP " + c.data_parallel_sharding_strategy
             : c.use_distributed_optimizer ? ", distributed optimizer"
                                           : "");
  if (stages.size() > 1) {
    fmt::print(out, "{:>6} {:>12} {:>11} {:>11} {:>12} {:>9} {:>11}\n", "stage", "params", "states", "act/mb",
               "in flight", "act", "total");
    for (const MemoryPlan& m : stages)
      fmt::print(out, "{:>6} {:>11.1f}M {:>11} {:>11} {:>12.2f} {:>9} {:>11}\n", m.pp_rank, m.params / 1e6,
                 gib(m.weights + m.bf16_weights + m.grads + m.adam + m.master + m.comm), gib(m.activations + m.logits),
                 m.in_flight, gib(m.peak_activations + m.working), gib(m.total()));
  }
  fmt::print(out, "worst rank (pipeline stage {}), per rank:\n", w.pp_rank);
  for (const auto& [name, b] : rows_of(c, w))
    if (b > 0) fmt::print(out, "  {:<26} {:>12}\n", name, gib(b));
  fmt::print(out, "  {:<26} {:>12}   ({:.2f} micro-batches in flight, {} each)\n", "total", gib(w.total()), w.in_flight,
             gib(w.activations + w.logits));
  if (w.host_offloaded > 0)
    fmt::print(out, "  {:<26} {:>12}   (host memory: --offload-modules {}, {} per micro-batch)\n",
               "offloaded to the host", gib(w.host_offloaded), fmt::join(c.offload_modules, " "), gib(w.offloaded));
  if (!w.buffers.empty()) {
    fmt::print(out, "  transient buffers of one MoE layer's dispatch and combine (inside the lines above):\n");
    for (const MemoryPlan::Buffer& b : w.buffers) fmt::print(out, "    {:<52} {:>12}\n", b.name, gib(b.bytes));
  }
  if (train::plans_gpu(c)) print_gpu_differences(out, c, padded_vocab, world, w);
}

// Megatron's levers for a run that does not fit, in the order its guides apply them (Megatron-Core MoE's best
// practice, Megatron-Bridge's "fit" phase), each applied on top of the last: the optimizer state sharded over the
// data-parallel ranks, more expert parallelism, selective recompute of the cheap modules, more pipeline stages;
// offloading only after recompute and parallelism; then the levers that change the numbers: Adam's moments in bf16
// (as the DeepSeek-V3 recipe keeps them) and, last (advise), full recompute.
struct Change {
  std::string what;
  std::function<bool(TrainConfig&, int64_t world)> apply;  // false: not possible from here
};

// Adds `modules` to the selective recompute list (keeping those already there); false when nothing is added or
// full recompute is already on.
bool add_recompute(TrainConfig& c, const std::vector<std::string>& modules) {
  if (c.recompute_granularity == "full") return false;
  std::vector<std::string> list =
      c.recompute_granularity == "selective" ? c.recompute_modules : std::vector<std::string>{};
  const size_t before = list.size();
  for (const std::string& m : modules)
    if (std::find(list.begin(), list.end(), m) == list.end()) list.push_back(m);
  if (list.size() == before && c.recompute_granularity == "selective") return false;
  c.recompute_granularity = "selective";
  c.recompute_modules = list;
  return true;
}

std::vector<Change> changes() {
  return {
      {"--use-distributed-optimizer",
       [](TrainConfig& c, int64_t world) {
         if (c.use_distributed_optimizer || world <= 1) return false;
         c.use_distributed_optimizer = true;
         return true;
       }},
      {"raise --expert-model-parallel-size",
       [](TrainConfig& c, int64_t world) {
         const int64_t ep = c.expert_model_parallel_size * 2, etp = std::max<int64_t>(c.expert_tensor_parallel_size, 1);
         if (c.num_experts == 0 || c.num_experts % ep != 0 || world % (ep * etp * c.pipeline_model_parallel_size))
           return false;
         c.expert_model_parallel_size = ep;
         return true;
       }},
      {"--recompute-granularity selective with --recompute-modules moe_act layernorm (MLA: moe_act mla_up_proj)",
       [](TrainConfig& c, int64_t) {
         // MLA refuses layernorm recompute (it keeps its whole stash); mla_up_proj is its cheap module.
         return add_recompute(c, c.multi_latent_attention ? std::vector<std::string>{"moe_act", "mla_up_proj"}
                                                          : std::vector<std::string>{"moe_act", "layernorm"});
       }},
      {"raise --pipeline-model-parallel-size",
       [](TrainConfig& c, int64_t world) {
         if (!c.pipeline_model_parallel_layout.empty()) return false;  // a layout string fixes the stages
         const int64_t pp = c.pipeline_model_parallel_size * 2;
         const int64_t model = c.tensor_model_parallel_size * c.context_parallel_size * pp;
         const int64_t etp = std::max<int64_t>(c.expert_tensor_parallel_size, 1);
         if (c.num_layers % pp != 0 || world % model != 0 || world % (c.expert_model_parallel_size * etp * pp) != 0)
           return false;
         if (c.global_batch_size % (c.micro_batch_size * (world / model)) != 0) return false;
         c.pipeline_model_parallel_size = pp;
         return true;
       }},
      // Where the distributed optimizer, more experts per rank and pipeline stages do not fit: Megatron FSDP's
      // ZeRO-3, the parameters and gradients sharded too (CPU only in moecore).
      {"--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params",
       [](TrainConfig& c, int64_t world) {
         if (world <= 1 || train::plans_gpu(c) || (c.optimizer != "adam" && c.optimizer != "sgd")) return false;
         if (c.use_megatron_fsdp && c.data_parallel_sharding_strategy == "optim_grads_params") return false;
         c.use_megatron_fsdp = c.use_distributed_optimizer = true;
         c.data_parallel_sharding_strategy = "optim_grads_params";
         return true;
       }},
      {"--fine-grained-activation-offloading --offload-modules (GPU: stashes to host memory while unused)",
       [](TrainConfig& c, int64_t) {
         // Offloading moves a GPU's stashes to host memory; a CPU's are there already. The modules Megatron's guide
         // offloads rather than recomputes, largest first, one group per application; none with `moe` recompute
         // (Megatron refuses expert_fc1 and moe_act offloading with it).
         // A GPU plan plans Megatron's run on that GPU: what moecore's own GPU path lacks does not stop the advice.
         if (!train::offloading_applies(train::planned_device(c))) return false;
         const auto has = [&](const std::vector<std::string>& v, const char* m) {
           return std::find(v.begin(), v.end(), m) != v.end();
         };
         if (c.recompute_granularity == "full" || has(c.recompute_modules, "moe")) return false;
         for (const std::vector<const char*>& group : std::vector<std::vector<const char*>>{
                  {"expert_fc1"}, {"core_attn", "attn_proj"}, {"qkv_linear"}, {"attn_norm", "mlp_norm"}}) {
           bool added = false;
           for (const char* m : group)
             if (!has(c.offload_modules, m)) c.offload_modules.push_back(m), added = true;
           if (added) {
             c.fine_grained_activation_offloading = true;
             return true;
           }
         }
         return false;
       }},
      {"--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 (Adam's moments rounded to bf16)",
       [](TrainConfig& c, int64_t) {
         if (!c.use_distributed_optimizer || c.optimizer != "adam" ||
             (c.exp_avg_dtype == "bf16" && c.exp_avg_sq_dtype == "bf16"))
           return false;
         c.use_precision_aware_optimizer = true;
         c.exp_avg_dtype = c.exp_avg_sq_dtype = "bf16";
         return true;
       }},
  };
}

void advise(std::FILE* out, TrainConfig c, int64_t padded_vocab, int64_t world, double device) {
  std::vector<std::string> applied;
  for (const Change& ch : changes()) {
    for (int k = 0; k < 16; k++) {  // a size change may be applied again (EP 8 -> 16 -> 32)
      TrainConfig next = c;
      if (!ch.apply(next, world)) break;
      double total = 0;
      try {
        total = worst(next, padded_vocab, world).total();
      } catch (const Error&) {
        break;  // a layout Megatron refuses (pipeline split, micro-batch rules)
      }
      // Offloading names the modules it has come to.
      const std::string what = next.offload_modules == c.offload_modules
                                   ? ch.what
                                   : fmt::format("--fine-grained-activation-offloading --offload-modules {}",
                                                 fmt::join(next.offload_modules, " "));
      c = next;
      applied.push_back(what + fmt::format(" ({})", gib(total)));
      if (total <= device) {
        fmt::print(out, "fits with: {}\n", fmt::join(applied, "; then "));
        return;
      }
    }
  }
  // Past Megatron's order: full recompute of every layer (the stash of one layer input each), on top of it all.
  TrainConfig full = c;
  full.recompute_granularity = "full";
  full.recompute_method = "uniform";
  full.recompute_num_layers = 1;
  full.recompute_modules.clear();
  std::string last = "or full recompute (--recompute-granularity full)";
  try {
    const double total = worst(full, padded_vocab, world).total();
    last = fmt::format(
        "or full recompute (--recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1: {}{})",
        gib(total), total <= device ? ", fits" : ", does not fit either");
  } catch (const Error&) {
  }
  fmt::print(out,
             "no change in Megatron's order (distributed optimizer, raise EP, recompute moe_act/layernorm, raise PP, "
             "Megatron FSDP, offloading on a GPU, bf16 Adam moments) makes it fit in {} on {} ranks; tried: {}. Use "
             "more ranks, a smaller "
             "--micro-batch-size or --seq-length, {}\n",
             gib(device), world,
             applied.empty() ? std::string("none applies") : fmt::format("{}", fmt::join(applied, "; ")), last);
}

void print_search(std::FILE* out, const train::plan::SearchResult& r, double limit) {
  fmt::print(out,
             "search: {} layouts tried, {} allowed, {} fit in {} per GPU ({} only with activation offloading); the "
             "fastest:\n",
             r.tried, r.valid, r.fitting, gib(limit), r.offloaded);
  for (size_t i = 0; i < r.best.size(); i++) {
    const train::plan::Candidate& k = r.best[i];
    fmt::print(out, "  {}. {:.1f} TFLOPS per GPU, {:.3f} s per step, {} per GPU{}: {}\n", i + 1,
               k.prediction.tflops_per_gpu, k.prediction.step_seconds, gib(k.memory_bytes),
               k.given ? " (the layout given)" : "", fmt::join(k.flags, " "));
  }
  if (!r.given_fits) {
    fmt::print(out, "the layout given {}\n",
               r.given.memory_bytes > 0 ? fmt::format("plans {} per GPU: it does not fit", gib(r.given.memory_bytes))
                                        : std::string("is not one Megatron allows"));
  } else if (!r.best.empty()) {
    if (r.best.front().given)
      fmt::print(out, "the layout given is the fastest that fits\n");
    else
      fmt::print(out, "the fastest is predicted {:.1f}% faster than the layout given ({:.1f} TFLOPS per GPU)\n",
                 100 * (r.given.prediction.step_seconds / r.best.front().prediction.step_seconds - 1),
                 r.given.prediction.tflops_per_gpu);
  }
}

}  // namespace

int run_plan(const std::vector<std::string>& args_in, std::FILE* out) {
  std::vector<std::string> args;
  int64_t world = 0;
  double device_gib = 0;
  std::string gpu_name;
  bool search = false;
  for (size_t i = 0; i < args_in.size(); i++) {
    const std::string& a = args_in[i];
    if (a == "--search") {
      search = true;
      continue;
    }
    if (a == "--plan-gpu") {
      MOE_CHECK(i + 1 < args_in.size(), "moecore plan: --plan-gpu needs a value ({})",
                fmt::join(train::plan::gpu_names(), ", "));
      gpu_name = args_in[++i];
      train::plan::gpu_spec(gpu_name);  // refuses an unknown name before any work
      continue;
    }
    if (a == "--world-size" || a == "--device-memory-gib") {
      MOE_CHECK(i + 1 < args_in.size(), "moecore plan: {} needs a value", a);
      const std::string& v = args_in[++i];
      if (a == "--world-size") {
        world = train::to_int(a, v);
        MOE_CHECK(world >= 1, "moecore plan: --world-size {} must be at least 1", world);
      } else {
        device_gib = train::to_double(a, v);
        MOE_CHECK(device_gib > 0, "moecore plan: --device-memory-gib {} must be positive", v);
      }
      continue;
    }
    args.push_back(a);
  }
  // Nothing is trained or read: a step count and a data source are not needed to plan (given ones are checked).
  auto given = [&](std::initializer_list<const char*> flags) {
    for (const std::string& a : args)
      for (const char* f : flags)
        if (a == f) return true;
    return false;
  };
  if (!given({"--train-iters", "--train-samples", "--skip-train"})) args.insert(args.end(), {"--train-iters", "1"});
  if (!given({"--mock-data", "--data-path", "--train-data-path", "--per-split-data-args-path", "--data-args-path"}))
    args.push_back("--mock-data");
  MOE_CHECK(!search || !gpu_name.empty(),
            "moecore plan: --search ranks layouts by predicted step time; add --plan-gpu "
            "({})",
            fmt::join(train::plan::gpu_names(), ", "));
  train::plan::PlanOptions options;
  options.tp_comm_overlap = given({"--tp-comm-overlap"});
  TrainConfig c = train::compose_train_config(train::parse_flags(args), /*plan_only=*/true);
  // A GPU plan plans the memory of a GPU run (no GPU is needed to plan): Megatron's run of these flags on that GPU,
  // so what moecore's own GPU path does not cover yet (device_support.cpp) does not stop it.
  if (!gpu_name.empty()) c.device = "cuda";
  const int64_t padded_vocab = train::build_vocabulary(c).padded;
  if (world == 0) world = PlanLayout::from(c, 0).world();
  print_plan(out, c, padded_vocab, world);
  if (!gpu_name.empty()) {
    const train::plan::GpuSpec& gpu = train::plan::gpu_spec(gpu_name);
    const PlanLayout l = PlanLayout::from(c, world);
    fmt::print(out, "{}",
               train::plan::describe(train::plan::predict_step(c, padded_vocab, l, gpu, options), gpu, world));
    if (search) {
      // The memory limit: --device-memory-gib, else the GPU's memory less 4 GiB (CUDA context, NCCL, fragmentation).
      const double limit = device_gib > 0 ? device_gib * 0x1p30 : (gpu.hbm_bytes / 1e9 - 4) * 0x1p30;
      print_search(out, train::plan::search_layouts(args, world, limit, gpu, options), limit);
    }
  }
  if (device_gib <= 0) return 0;
  const double device = device_gib * 0x1p30, total = worst(c, padded_vocab, world).total();
  if (total <= device) {
    fmt::print(out, "fits in {} per device ({} free)\n", gib(device), gib(device - total));
    return 0;
  }
  fmt::print(out, "does not fit in {} per device (needs {})\n", gib(device), gib(total));
  advise(out, c, padded_vocab, world, device);
  return 3;
}

}  // namespace moecore::cli
