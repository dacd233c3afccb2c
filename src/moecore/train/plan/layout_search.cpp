// The layout search (see layout_search.h).
#include "moecore/train/plan/layout_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"

namespace moecore::train::plan {

namespace {

// The flags a candidate sets (with their value counts), removed from the command line first.
const std::set<std::string>& layout_flags() {
  static const std::set<std::string> f = {"--tensor-model-parallel-size",
                                          "--context-parallel-size",
                                          "--pipeline-model-parallel-size",
                                          "--pipeline-model-parallel-layout",
                                          "--num-virtual-stages-per-pipeline-rank",
                                          "--num-layers-per-virtual-pipeline-stage",
                                          "--decoder-first-pipeline-num-layers",
                                          "--decoder-last-pipeline-num-layers",
                                          "--expert-model-parallel-size",
                                          "--expert-tensor-parallel-size",
                                          "--recompute-granularity",
                                          "--recompute-method",
                                          "--recompute-num-layers",
                                          "--recompute-modules",
                                          "--sequence-parallel",
                                          "--use-distributed-optimizer",
                                          "--use-megatron-fsdp",
                                          "--data-parallel-sharding-strategy",
                                          "--micro-batch-size",
                                          "--fine-grained-activation-offloading",
                                          "--offload-modules"};
  return f;
}

std::vector<std::string> without_layout(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); i++) {
    if (!layout_flags().count(args[i])) {
      out.push_back(args[i]);
      continue;
    }
    while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) i++;  // its values
  }
  return out;
}

// Fine-grained activation offloading of every module a layer's stash has (attn_proj with core_attn, as Megatron
// requires); recomputed modules keep nothing to offload.
const std::vector<std::string>& offload_flags() {
  static const std::vector<std::string> f = {"--fine-grained-activation-offloading",
                                             "--offload-modules",
                                             "attn_norm",
                                             "qkv_linear",
                                             "core_attn",
                                             "attn_proj",
                                             "mlp_norm",
                                             "expert_fc1",
                                             "moe_act"};
  return f;
}

// A pipeline layout string for `stages` stages: the embedding on the first, MTP and the loss on the last, the
// decoder layers spread as evenly as they go, the extra ones on the middle stages.
std::string layout_string(int64_t layers, int64_t stages, int64_t mtp) {
  std::string s;
  const int64_t base = layers / stages, extra = layers % stages, skip = (stages - extra) / 2;
  for (int64_t i = 0; i < stages; i++) {
    if (i > 0) s += "|";
    if (i == 0) s += "E";
    const int64_t n = base + (i >= skip && i < skip + extra ? 1 : 0);
    s += std::string(static_cast<size_t>(n), 't');
    if (i == stages - 1) s += std::string(static_cast<size_t>(mtp), 'm') + "L";
  }
  return s;
}

// What the search varies beside the parallel sizes and recompute: ETP 1 or the TP size, the micro-batch size given
// or twice it, the distributed optimizer or Megatron FSDP (optim_grads_params).
struct Variant {
  int64_t etp = 1, mbs = 1;
  bool fsdp = false;
};
std::vector<Variant> variants(int64_t tp, int64_t world, int64_t mbs) {
  std::vector<Variant> v;
  for (int64_t etp : tp > 1 ? std::vector<int64_t>{1, tp} : std::vector<int64_t>{1})
    for (int64_t b : {mbs, 2 * mbs})
      for (bool fsdp : world > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
        v.push_back({etp, b, fsdp});
  return v;
}

std::vector<int64_t> powers_of_two(int64_t most) {
  std::vector<int64_t> v;
  for (int64_t x = 1; x <= most; x *= 2) v.push_back(x);
  return v;
}

// Evaluates `flags` (the run's plus a layout); false where Megatron (or moecore) refuses the combination.
// Predicts its step only where its memory plan fits in `limit`.
bool evaluate(const std::vector<std::string>& base, const std::vector<std::string>& layout, int64_t world, double limit,
              const GpuSpec& gpu, const PlanOptions& options, Candidate& out) {
  std::vector<std::string> args = base;
  args.insert(args.end(), layout.begin(), layout.end());
  try {
    TrainConfig c = compose_train_config(parse_flags(args), /*plan_only=*/true);
    c.device = "cuda";  // the memory of a GPU run (as moecore plan --plan-gpu plans it)
    const int64_t vocab = build_vocabulary(c).padded;
    const PlanLayout l = PlanLayout::from(c, world);
    if (c.global_batch_size % (c.micro_batch_size * l.dp) != 0) return false;
    out.memory_bytes = worst_stage(plan_memory_stages(c, vocab, l)).total();
    if (out.memory_bytes <= limit) out.prediction = predict_step(c, vocab, l, gpu, options);
    out.flags = layout;
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

SearchResult search_layouts(const std::vector<std::string>& args, int64_t world, double memory_limit,
                            const GpuSpec& gpu, const PlanOptions& options, int keep) {
  SearchResult r;
  const TrainConfig c = compose_train_config(parse_flags(args), /*plan_only=*/true);
  const std::vector<std::string> base = without_layout(args);
  // The command line's own layout, as given.
  std::vector<std::string> given_layout;
  for (size_t i = 0; i < args.size(); i++)
    if (layout_flags().count(args[i])) {
      given_layout.push_back(args[i]);
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) given_layout.push_back(args[++i]);
    }
  if (evaluate(base, given_layout, world, 1e300, gpu, options, r.given)) {
    r.given.given = true;
    r.given_fits = r.given.memory_bytes <= memory_limit;
  }
  const int64_t heads = c.num_attention_heads, groups = c.num_query_groups > 0 ? c.num_query_groups : heads;
  const std::vector<std::vector<std::string>> recomputes = {
      {},
      {"--recompute-granularity", "selective", "--recompute-modules", "moe_act",
       c.multi_latent_attention ? "mla_up_proj" : "layernorm"},
      {"--recompute-granularity", "selective", "--recompute-modules",
       c.multi_latent_attention ? "mla_up_proj" : "core_attn", "mlp", "moe_act"},
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}};
  std::vector<Candidate> fits;
  for (int64_t tp : powers_of_two(std::min<int64_t>(gpu.gpus_per_nvlink_domain, 8))) {
    if (heads % tp != 0 || (groups % tp != 0 && !c.multi_latent_attention)) continue;
    for (int64_t cp : {1, 2})
      for (int64_t pp : powers_of_two(16))
        for (int64_t vpp : {1, 2, 4}) {
          if (pp == 1 && vpp > 1) continue;
          if (world % (tp * cp * pp) != 0 || pp * vpp > c.num_layers) continue;  // no stage without a layer
          for (int64_t ep : powers_of_two(std::max<int64_t>(c.num_experts, 1)))
            for (const Variant& var : variants(tp, world, c.micro_batch_size)) {
              if ((c.num_experts > 0 && c.num_experts % ep != 0) || (world / pp) % (ep * var.etp) != 0) continue;
              for (const std::vector<std::string>& rc : recomputes) {
                std::vector<std::string> layout = {"--tensor-model-parallel-size",
                                                   std::to_string(tp),
                                                   "--context-parallel-size",
                                                   std::to_string(cp),
                                                   "--pipeline-model-parallel-size",
                                                   std::to_string(pp),
                                                   "--expert-model-parallel-size",
                                                   std::to_string(ep),
                                                   "--expert-tensor-parallel-size",
                                                   std::to_string(var.etp),
                                                   "--micro-batch-size",
                                                   std::to_string(var.mbs)};
                if (tp > 1) layout.push_back("--sequence-parallel");
                if (world > 1) layout.push_back("--use-distributed-optimizer");
                if (var.fsdp)
                  layout.insert(layout.end(),
                                {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"});
                if (pp * vpp > 1 && (c.num_layers % (pp * vpp) != 0 || c.mtp_num_layers > 0))
                  layout.insert(layout.end(), {"--pipeline-model-parallel-layout",
                                               layout_string(c.num_layers, pp * vpp, c.mtp_num_layers)});
                else if (vpp > 1)
                  layout.insert(layout.end(), {"--num-virtual-stages-per-pipeline-rank", std::to_string(vpp)});
                layout.insert(layout.end(), rc.begin(), rc.end());
                r.tried++;
                Candidate cand;
                if (!evaluate(base, layout, world, memory_limit, gpu, options, cand)) continue;
                r.valid++;
                if (cand.memory_bytes > memory_limit) {
                  // Offloading only adds host copies to a step (hidden behind compute or exposed), never speeds
                  // it up: tried only for a layout that does not fit without it, with every module that can go.
                  std::vector<std::string> offloaded = layout;
                  offloaded.insert(offloaded.end(), offload_flags().begin(), offload_flags().end());
                  r.tried++;
                  if (!evaluate(base, offloaded, world, memory_limit, gpu, options, cand) ||
                      cand.memory_bytes > memory_limit)
                    continue;
                  r.valid++;
                  r.offloaded++;
                }
                r.fitting++;
                fits.push_back(std::move(cand));
              }
            }
        }
  }
  if (r.given_fits) fits.push_back(r.given);
  std::sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
    return a.prediction.step_seconds < b.prediction.step_seconds;
  });
  for (const Candidate& f : fits) {
    if (std::ssize(r.best) >= keep) break;
    r.best.push_back(f);
  }
  return r;
}

}  // namespace moecore::train::plan
