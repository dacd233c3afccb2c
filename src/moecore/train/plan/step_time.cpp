// One training step's predicted time (see step_time.h): the layers' op times per pipeline chunk, the pipeline
// simulated pass by pass in Megatron's order, then the data-parallel communication and the optimizer step.
#include "moecore/train/plan/step_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "moecore/core/error.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/observe/cost_model.h"
#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/pipeline/pipeline_stages.h"
#include "moecore/train/plan/op_costs.h"

namespace moecore::train::plan {

std::vector<double> simulate_pipeline(int64_t M, int64_t P, int64_t V, int64_t group,
                                      const std::vector<std::vector<double>>& fwd,
                                      const std::vector<std::vector<double>>& bwd, double p2p, bool combined) {
  std::vector<double> end(static_cast<size_t>(P), 0.0);
  if (P == 1) {
    for (int64_t v = 0; v < V; v++) end[0] += static_cast<double>(M) * (fwd[0][v] + bwd[0][v]);
    return end;
  }
  const int64_t stages = P * V;
  // done[(mb * stages + stage) * 2 + backward]: when that pass finished (-1: not yet).
  std::vector<double> done(static_cast<size_t>(M * stages * 2), -1.0);
  auto at = [&](int64_t mb, int64_t stage, bool backward) -> double& {
    return done[static_cast<size_t>((mb * stages + stage) * 2 + (backward ? 1 : 0))];
  };
  std::vector<std::vector<PipelinePass>> order(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; r++) order[r] = pipeline_order(M, P, r, V, group > 0 ? group : P, false, combined);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  // When pass p of rank r may start: its message's arrival (0: none comes); negative: not sent yet.
  auto ready_of = [&](int64_t r, const PipelinePass& p) {
    const int64_t stage = p.chunk * P + r;
    double t = 0;
    if (p.forward && stage > 0)
      t = at(p.micro_batch, stage - 1, false);
    else if (!p.forward && stage + 1 < stages)
      t = at(p.micro_batch, stage + 1, true);
    else
      return 0.0;
    return t < 0 ? -1.0 : t + p2p;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < P; r++) {
      while (next[r] < order[r].size()) {
        const PipelinePass& p = order[r][next[r]];
        // A merged pair (combined 1F1B) starts once both its messages came and runs both passes; both send at its end.
        const PipelinePass* q = p.merged ? &order[r][next[r] + 1] : nullptr;
        const double ready = ready_of(r, p), ready_q = q ? ready_of(r, *q) : 0.0;
        if (ready < 0 || ready_q < 0) break;
        const double start = std::max({end[r], ready, ready_q});
        end[r] = start + (p.forward ? fwd[r][p.chunk] : bwd[r][p.chunk]) + (q ? bwd[r][q->chunk] : 0.0);
        at(p.micro_batch, p.chunk * P + r, !p.forward) = end[r];
        if (q) at(q->micro_batch, q->chunk * P + r, true) = end[r];
        next[r] += q ? 2 : 1;
        progress = true;
      }
    }
  }
  for (int64_t r = 0; r < P; r++) MOE_ASSERT(next[r] == order[r].size());
  return end;
}

namespace {

struct RankSteps {
  std::vector<double> fwd, bwd;                  // per chunk, one micro-batch
  OpTimes all;                                   // every pass of the step (M micro-batches, forward and backward)
  double recompute = 0;                          // of which recompute's extra forward (compute and communication)
  std::vector<double> fwd_compute, bwd_compute;  // per chunk: what FSDP's gathers and scatters hide behind
  double dp_exposed = 0, optimizer = 0;
  double fsdp = 0;     // Megatron FSDP's exposed gathers and scatters, inside the passes (all micro-batches)
  double offload = 0;  // activation offloading's exposed host copies, inside the passes (all micro-batches)
  std::map<std::string, double> dp_by_group;
  int64_t host_syncs = 0;  // per step
};

}  // namespace

StepPrediction predict_step(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, const GpuSpec& gpu,
                            const PlanOptions& options) {
  const Links links = links_of(l, gpu);
  const LayerBytes bytes = layer_bytes(c, l);
  const nn::RecomputeConfig rc = recompute_config(c);
  const int64_t V = virtual_stages(c), M = l.num_microbatches;
  const double m = static_cast<double>(M);
  const int64_t syncs = host_syncs_per_moe_forward(c) * M;  // one MoE layer's forwards in a step
  LayerTimes kinds[2][2];                                   // [moe][full recompute]
  for (int moe = 0; moe < 2; moe++)
    for (int full = 0; full < 2; full++)
      kinds[moe][full] = layer_times(c, l, gpu, links, bytes, options, moe == 1, full == 1);
  const LayerTimes embed = embedding_times(c, l, gpu);
  const LayerTimes loss = loss_times(c, padded_vocab, l, gpu, links, bytes, options);
  std::vector<RankSteps> ranks(static_cast<size_t>(l.pp));
  std::vector<std::vector<double>> fwd, bwd;
  for (int64_t r = 0; r < l.pp; r++) {
    RankSteps& rs = ranks[r];
    const std::vector<StageLayers> chunks = pipeline_stage_layers(c, r);
    MOE_ASSERT(std::ssize(chunks) == V);
    for (const StageLayers& ch : chunks) {
      OpTimes f, b, re;
      auto add_layer = [&](const LayerTimes& t) { f += t.fwd, b += t.bwd, b += t.recompute, re += t.recompute; };
      for (int64_t i = 0; i < ch.num_layers; i++) {
        const int64_t layer = ch.first_layer + i;
        const bool full = rc.full && rc.chunk(i, ch.num_layers).on();
        add_layer(kinds[c.is_moe_layer[layer] ? 1 : 0][full ? 1 : 0]);
        if (c.is_moe_layer[layer]) rs.host_syncs += syncs * (full || rc.moe ? 2 : 1);
      }
      if (ch.embedding) add_layer(embed);
      if (ch.loss) add_layer(loss);
      for (int64_t d = 0; d < ch.mtp_layers; d++) {  // one more layer of the last layer's kind, its own logits
        add_layer(kinds[c.is_moe_layer.back() ? 1 : 0][0]);
        add_layer(loss);
        if (c.is_moe_layer.back()) rs.host_syncs += syncs * (rc.moe ? 2 : 1);
      }
      rs.fwd.push_back(f.total());
      rs.bwd.push_back(b.total());
      rs.fwd_compute.push_back(f.compute());
      rs.bwd_compute.push_back(b.compute());
      rs.all += (f += b) * m;
      rs.recompute += re.total() * m;
    }
    // Data parallel: the cost model's bytes of this stage's parameters; reduce-scatter (or all-reduce) of the
    // gradients after the last backward, all-gather of the updated parameters after the step.
    const ParamCounts p = count_params(c, padded_vocab, l.tp, l.ep * l.etp, r);
    const bool bf16 = c.bf16 || c.fp16;
    CommSizes z;
    z.tp = l.tp, z.dp = l.dp, z.ep = l.ep, z.etp = l.etp, z.edp = l.edp, z.num_microbatches = M;
    z.n_dense = p.dense, z.n_exp = p.expert;
    // Gradients on the wire: f32, or bf16 under --grad-reduce-in-bf16 / bf16 main gradients; the parameters
    // gathered as stored (FP8 under --fp8-param-gather).
    z.grad_bytes = c.grad_reduce_in_bf16 || c.main_grads_dtype == "bf16" ? 2.0 : 4.0;
    const double stored = c.fp8_param_gather ? 1.0 : 2.0;
    z.w_dense = bf16 ? stored * (p.dense - p.f32_dense) + 4 * p.f32_dense : 4 * p.dense;
    z.w_exp = bf16 ? stored * (p.expert - p.f32_expert) + 4 * p.f32_expert : 4 * p.expert;
    const std::map<std::string, double> dpb = analytic_comm_bytes(c, z);
    const bool sharded = c.use_distributed_optimizer && (c.optimizer == "adam" || c.optimizer == "sgd");
    double reduce = 0, gather = 0;
    for (const auto& [name, link, lat, n, w] : {std::tuple{"dp", links.dp, links.latency.dp, z.n_dense, z.w_dense},
                                                std::tuple{"edp", links.edp, links.latency.edp, z.n_exp, z.w_exp}}) {
      if (!dpb.count(name) || dpb.at(name) <= 0) continue;
      const double t = dpb.at(name) / link, grad_share = sharded ? n * z.grad_bytes / (n * z.grad_bytes + w) : 1.0;
      reduce += t * grad_share + lat, gather += t * (1 - grad_share) + (sharded ? lat : 0.0);
    }
    // Megatron FSDP (docs/user-guide/features/megatron_fsdp.md): the gradients' reduce-scatter in every backward
    // (optim_grads and optim_grads_params), the parameters' all-gather before every forward and backward
    // (optim_grads_params), prefetched behind the passes' compute; what exceeds it is exposed.
    const bool fsdp = c.use_megatron_fsdp && l.world() > 1 && c.data_parallel_sharding_strategy != "no_shard";
    if (fsdp) {
      const bool params = c.data_parallel_sharding_strategy == "optim_grads_params";
      double ag = 0, rsc = 0;
      for (const auto& [P, link, lat, n, w] : {std::tuple{l.dp, links.dp, links.latency.dp, z.n_dense, z.w_dense},
                                               std::tuple{l.edp, links.edp, links.latency.edp, z.n_exp, z.w_exp}}) {
        if (P <= 1 || n <= 0) continue;
        const double share = static_cast<double>(P - 1) / static_cast<double>(P);
        ag += share * w / link + lat;
        rsc += share * n * z.grad_bytes / link + lat;
      }
      const double v = static_cast<double>(V);
      auto exposed = [&](double comm, double compute) {
        const double hidden = std::min(comm, compute);
        return comm - hidden + hidden * gpu.overlap_cost();
      };
      for (int64_t k = 0; k < V; k++) {
        const double fe = params ? exposed(ag / v, rs.fwd_compute[k]) : 0.0;
        const double be = exposed(((params ? ag : 0.0) + rsc) / v, rs.bwd_compute[k]);
        rs.fwd[k] += fe, rs.bwd[k] += be, rs.fsdp += (fe + be) * m;
      }
      reduce = 0, gather = params ? 0.0 : ag;
    }
    // Fine-grained activation offloading: the stage's offloaded stashes copied to the host in each forward and
    // back in each backward, on a copy stream beside the pass's compute (Megatron's offloading manager); the part
    // of the copies longer than the compute of its pass is exposed. Spread evenly over the stage's model chunks.
    const StageOffload off = stage_offload(c, padded_vocab, l, r);
    if (off.per_micro_batch > 0 && gpu.host_bandwidth > 0) {
      const double copy = off.per_micro_batch / static_cast<double>(V) / gpu.host_bandwidth;
      for (int64_t k = 0; k < V; k++) {
        const double fe = std::max(0.0, copy - rs.fwd_compute[k]), be = std::max(0.0, copy - rs.bwd_compute[k]);
        rs.fwd[k] += fe, rs.bwd[k] += be, rs.offload += (fe + be) * m;
      }
    }
    fwd.push_back(rs.fwd);
    bwd.push_back(rs.bwd);
    rs.optimizer =
        optimizer_seconds(c,
                          sharded || fsdp ? p.dense / static_cast<double>(l.dp) + p.expert / static_cast<double>(l.edp)
                                          : p.dense + p.expert,
                          gpu);
    double last_bwd = 0, first_fwd = 0;
    for (int64_t v = 0; v < V; v++) last_bwd += rs.bwd[v], first_fwd += rs.fwd[v];
    const double reduce_exposed = c.overlap_grad_reduce ? std::max(0.0, reduce - last_bwd) : reduce;
    const double gather_exposed = c.overlap_param_gather_with_optimizer_step ? std::max(0.0, gather - rs.optimizer)
                                  : c.overlap_param_gather                   ? std::max(0.0, gather - first_fwd)
                                                                             : gather;
    rs.dp_exposed = reduce_exposed + gather_exposed;
  }
  const double p2p = static_cast<double>(c.seq_length * c.micro_batch_size) / static_cast<double>(l.cp * l.tp) *
                         static_cast<double>(c.hidden_size) * (c.bf16 || c.fp16 ? 2.0 : 4.0) / links.pp +
                     links.latency.pp;
  const std::vector<double> end =
      simulate_pipeline(M, l.pp, V, c.microbatch_group_size_per_vp_stage, fwd, bwd, p2p, combined_1f1b(c) && V > 1);
  StepPrediction out;
  for (int64_t r = 0; r < l.pp; r++) {
    const double t = end[r] + ranks[r].dp_exposed + ranks[r].optimizer;
    if (t > out.step_seconds) out.step_seconds = t, out.critical_pp_rank = r;
  }
  const RankSteps& rs = ranks[out.critical_pp_rank];
  const OpTimes& a = rs.all;
  out.compute = {{"dense GEMMs", a.dense_gemm},
                 {"expert GEMMs", a.expert_gemm},
                 {"attention", a.attention},
                 {"memory-bound", a.memory},
                 {"kernel launches", a.launch}};
  out.exposed_comm = {{"tp", a.tp},
                      {"cp", a.cp},
                      {"ep", a.ep},
                      {"etp", a.etp},
                      {"dp", rs.dp_exposed + rs.fsdp},
                      {"offload (host)", rs.offload}};
  out.recompute = rs.recompute;
  out.optimizer = rs.optimizer;
  out.host_syncs = rs.host_syncs;
  out.bubble = std::max(0.0, end[out.critical_pp_rank] - a.total());
  const double tokens = static_cast<double>(c.global_batch_size * c.seq_length);
  out.tokens_per_second = tokens / out.step_seconds;
  out.flops = num_floating_point_operations(c, padded_vocab);
  out.tflops_per_gpu = out.flops / out.step_seconds / static_cast<double>(l.world()) / 1e12;
  out.mfu = out.tflops_per_gpu * 1e12 / gpu.peak_bf16;
  return out;
}

std::string describe(const StepPrediction& p, const GpuSpec& gpu, int64_t world) {
  std::string s = fmt::format(
      "predicted step on {} x {}: {:.3f} s, {:.0f} tokens/s ({:.0f} per GPU), {:.1f} TFLOPS per GPU (Megatron's "
      "FLOP count), MFU {:.1f}% of {:.0f} TFLOPS BF16\n",
      world, gpu.description, p.step_seconds, p.tokens_per_second, p.tokens_per_second / static_cast<double>(world),
      p.tflops_per_gpu, 100 * p.mfu, gpu.peak_bf16 / 1e12);
  s += fmt::format("  breakdown of pipeline stage {}'s step (seconds):\n", p.critical_pp_rank);
  for (const auto& [name, t] : p.compute) s += fmt::format("    compute {:<22} {:>9.3f}\n", name, t);
  s += fmt::format("    {:<30} {:>9.3f}\n", "recompute (in the lines above)", p.recompute);
  for (const auto& [name, t] : p.exposed_comm)
    if (t > 0) s += fmt::format("    exposed comm {:<17} {:>9.3f}\n", name, t);
  s += fmt::format("    {:<30} {:>9.3f}\n    {:<30} {:>9.3f}\n", "pipeline bubble", p.bubble, "optimizer step",
                   p.optimizer);
  s += "  not priced (docs/plan.md, \"Where the model is known to be wrong\"): the host's own time per call (Python,\n"
       "    PyTorch, TransformerEngine), CUDA graphs, the data loader";
  if (p.host_syncs > 0)
    s += fmt::format(
        ",\n    and {} host-GPU synchronizations a step on that stage (the MoE dispatcher reads its token counts back "
        "in\n    each MoE layer's forward of each micro-batch; the host cannot run ahead of the GPU past them)",
        p.host_syncs);
  s += "\n";
  return s;
}

}  // namespace moecore::train::plan
