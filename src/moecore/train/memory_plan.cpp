// Memory before work (see memory_plan.h): the plan from the configuration, the limit from the cgroup and
// /proc/meminfo, and the refusal. Not here: the allocator's own out-of-memory error (core/allocator.cpp), the
// printed plan with the built model's exact parameter count (metrics.cpp, print_memory_plan).
#include "moecore/train/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "moecore/comm/mpi_check.h"
#include "moecore/core/error.h"
#include "moecore/kernels/gemm.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/observe/metrics.h"
#include "moecore/train/parallel_groups.h"
#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::train {

namespace {

// A number from the first line of a file; nothing when absent, unreadable or "max" (no limit).
std::optional<double> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return std::nullopt;
  try {
    return std::stod(s);
  } catch (...) {
    return std::nullopt;
  }
}

// The cgroup path of this process for a controller ("" for v2's unified hierarchy), from /proc/self/cgroup.
std::string cgroup_path(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::stringstream names(line.substr(a + 1, b - a - 1));
    for (std::string n; std::getline(names, n, ',');)
      if (n == controller) return line.substr(b + 1);
    if (controller.empty() && b == a + 1) return line.substr(b + 1);
  }
  return "/";
}

// Headroom of a cgroup: its limit less its usage, when it has a limit (v1 writes ~2^63 for none).
std::optional<double> cgroup_headroom(const std::string& dir, const char* limit_file, const char* usage_file,
                                      std::string& source) {
  const auto limit = read_number(dir + "/" + limit_file);
  if (!limit || *limit >= 0x1p62) return std::nullopt;
  const double used = read_number(dir + "/" + usage_file).value_or(0);
  source = fmt::format("{}/{} {} with {} in use", dir, limit_file, human_bytes(*limit), human_bytes(used));
  return std::max(0.0, *limit - used);
}

}  // namespace

std::string MemoryPlan::describe() const {
  std::string s = fmt::format("weights {} | gradients {} | Adam moments {}", human_bytes(weights), human_bytes(grads),
                              human_bytes(adam));
  if (master > 0) s += fmt::format(" | f32 master weights {}", human_bytes(master));
  if (bf16_weights > 0) s += fmt::format(" | bf16 weight copies {}", human_bytes(bf16_weights));
  if (packed_weights > 0)
    s += fmt::format(" (packed expert weights {}: MOECORE_PACK_WEIGHTS=off drops them)", human_bytes(packed_weights));
  if (comm > 0) s += fmt::format(" | comm buffers {}", human_bytes(comm));
  if (fsdp_units > 0) s += fmt::format(" | FSDP units in flight {}", human_bytes(fsdp_units));
  s +=
      fmt::format(" | activations {} per micro-batch x {:.2f} in flight", human_bytes(activations + logits), in_flight);
  if (logits > 0) s += fmt::format(" (logits {})", human_bytes(logits));
  s += fmt::format(" = {} | backward working set {}", human_bytes(peak_activations), human_bytes(working));
  if (offloaded > 0)
    s += fmt::format(" | offloaded to host {} per micro-batch, {} at the peak (device window {})",
                     human_bytes(offloaded), human_bytes(host_offloaded), human_bytes(offload_window));
  return s;
}

PlanLayout PlanLayout::from(const TrainConfig& c, int64_t world) {
  PlanLayout l;
  l.tp = c.tensor_model_parallel_size, l.cp = c.context_parallel_size, l.pp = c.pipeline_model_parallel_size;
  l.ep = c.expert_model_parallel_size;
  l.etp = c.expert_tensor_parallel_size > 0 ? c.expert_tensor_parallel_size : l.tp;
  const int64_t model = l.tp * l.cp * l.pp;
  if (world <= 0) world = std::max(model, l.ep * l.etp * l.pp);
  MOE_CHECK(world % model == 0, "world size {} is not divisible by TP x CP x PP = {} x {} x {}", world, l.tp, l.cp,
            l.pp);
  MOE_CHECK(world % (l.ep * l.etp * l.pp) == 0,
            "world size {} is not divisible by EP x ETP x PP = {} x {} x {} (the expert mesh)", world, l.ep, l.etp,
            l.pp);
  l.dp = world / model;
  l.edp = world / (l.ep * l.etp * l.pp);
  l.num_microbatches = std::max<int64_t>(1, c.global_batch_size / std::max<int64_t>(1, c.micro_batch_size * l.dp));
  return l;
}

namespace {
// The packed copies of the expert weights a bf16 step on the CPU keeps (kernels::PackedWeight, two layouts per
// weight: forward and data gradient) when it packs (kernels::pack_weights_for); expert_params are this rank's.
double packed_expert_bytes(const TrainConfig& c, const PlanLayout& l, double expert_params) {
  if (!c.bf16 || c.num_experts <= 0 || expert_params <= 0 || !kernels::pack_weights_for(l.num_microbatches)) return 0;
  if (plans_gpu(c)) return 0;  // a GPU run keeps none
  const int64_t H = c.hidden_size, F = std::max<int64_t>(c.moe_ffn_hidden_size / std::max<int64_t>(l.etp, 1), 1),
                F1 = (c.swiglu ? 2 : 1) * F, m = 1024;
  const double per_expert =
      static_cast<double>(kernels::packed_weight_bytes(H, F1, true, m) + kernels::packed_weight_bytes(F1, H, false, m) +
                          kernels::packed_weight_bytes(F, H, true, m) + kernels::packed_weight_bytes(H, F, false, m));
  const int64_t biases = c.disable_bias_linear ? 0 : F1 + H;  // per expert, not packed
  return expert_params / static_cast<double>(F1 * H + H * F + biases) * per_expert;
}

// The pipeline messages alive at once on stage `pp_rank` (train/pipeline/pipeline_p2p.cpp, pipeline_schedule.cpp),
// walked pass by pass in the schedule's order: the receive the schedule posts one pass ahead (only the next pass's);
// during a backward of a chunk that sends its output, the output gradient it received (a forward's received input is
// its first layer's stashed input, counted in the stash); and the buffers of the sends made so far, each alive until
// it completes and a later send or the step's end frees it, at most one per micro-batch in flight. The last stage of
// a two-micro-batch step thus holds one message at a time: the next input's receive, or the previous backward's send.
double p2p_messages(const TrainConfig& c, const PlanLayout& l, int64_t pp_rank, double in_flight) {
  const int64_t P = std::max<int64_t>(l.pp, 1), r = std::clamp<int64_t>(pp_rank, 0, P - 1);
  const int64_t v = static_cast<int64_t>(pipeline_stage_layers(c, r).size());
  auto receives_input = [&](int64_t ch) { return !(r == 0 && ch == 0); };
  auto sends_output = [&](int64_t ch) { return !(r == P - 1 && ch == v - 1); };
  // Combined 1F1B: a merged pair posts the receive of the pass after it too (pipeline_schedule.cpp).
  const bool combined = combined_1f1b(c) && (P == 1 || v > 1);
  const std::vector<PipelinePass> order = pipeline_order(std::max<int64_t>(l.num_microbatches, 1), P, r, v,
                                                         c.microbatch_group_size_per_vp_stage, false, combined);
  auto needs_recv = [&](const PipelinePass& p) { return p.forward ? receives_input(p.chunk) : sends_output(p.chunk); };
  const double sends_cap = std::ceil(in_flight);
  double most = 0, sent = 0;
  for (size_t k = 0; k < order.size(); k++) {
    const PipelinePass& p = order[k];
    double live = std::min(sent, sends_cap);
    if (k + 1 < order.size() && needs_recv(order[k + 1])) live += 1;
    if (p.merged && k + 2 < order.size() && needs_recv(order[k + 2])) live += 1;
    if (!p.forward && sends_output(p.chunk)) live += 1;
    most = std::max(most, live);
    if (p.forward ? sends_output(p.chunk) : receives_input(p.chunk)) sent += 1;
  }
  return most;
}
}  // namespace

Device planned_device(const TrainConfig& c) {
  if (c.device.rfind("cuda", 0) == 0) return Device::cuda(0);  // on any machine (moecore plan)
  return c.device == "auto" ? training_device(c) : Device::cpu();
}

bool plans_gpu(const TrainConfig& c) {
  return planned_device(c).is_cuda();
}

ParamCounts count_params(const TrainConfig& c, int64_t padded_vocab, int64_t tp, int64_t ep_etp, int64_t pp_rank) {
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.kv_channels);
  const double N = static_cast<double>(c.num_attention_heads), G = static_cast<double>(c.num_query_groups);
  const double V = static_cast<double>(padded_vocab), t = static_cast<double>(tp);
  const double glu = c.swiglu ? 3.0 : 2.0, bias = c.disable_bias_linear ? 0.0 : 1.0;
  const double norm = c.normalization == "LayerNorm" ? 2.0 : 1.0;  // weight (+ bias) per norm
  const double positions =
      c.position_embedding_type == "learned_absolute" ? static_cast<double>(c.max_position_embeddings) * H : 0.0;
  // Split over TP: the projections; replicated: the norms (and MLA's down projections).
  double attn = (H * (N + 2 * G) * D + N * D * H + bias * (N + 2 * G) * D) / t + bias * H +
                norm * (2 * H + (c.qk_layernorm ? 2 * D : 0));
  // Of each: what stays f32 under --bf16 (biases, norms, router, shared-expert gate; the rest are GEMM weights).
  double attn_f32 = bias * (N + 2 * G) * D / t + bias * H + norm * (2 * H + (c.qk_layernorm ? 2 * D : 0));
  if (c.multi_latent_attention) {  // nn/mla_attention.h: down, up and output projections, latent norms
    const double Q = static_cast<double>(c.q_lora_rank), R = static_cast<double>(c.kv_lora_rank);
    const double Dq = static_cast<double>(c.qk_head_dim + c.qk_pos_emb_head_dim);
    const double Dr = static_cast<double>(c.qk_pos_emb_head_dim), Dv = static_cast<double>(c.v_head_dim);
    attn = (Q > 0 ? H * Q + Q * N * Dq / t : H * N * Dq / t) + H * (R + Dr) +
           (R * N * (Dq - Dr + Dv) + N * Dv * H) / t + norm * (2 * H + (c.qk_layernorm ? Q + R : 0)) + bias * H;
    attn_f32 = norm * (2 * H + (c.qk_layernorm ? Q + R : 0)) + bias * H;
  }
  const double dense_ffn = (glu * H * static_cast<double>(c.ffn_hidden_size)) / t + bias * (H + glu / 2 * H);
  const double E = static_cast<double>(c.num_experts), Fs = static_cast<double>(c.moe_shared_expert_intermediate_size);
  const double dense_ffn_f32 = bias * (H + glu / 2 * H);
  const double moe_dense = E * H + bias * E + glu * H * Fs / t + (c.moe_shared_expert_gate ? H : 0);
  const double moe_dense_f32 = E * H + bias * E + (c.moe_shared_expert_gate ? H : 0);
  // Per expert fc1 [F1, H] and fc2 [H, F] weights, with biases fc1's [F1] and fc2's [H] (F1 = (glu − 1)·F; biases
  // need ETP 1, so ep_etp is EP then).
  const double Fm = static_cast<double>(c.moe_ffn_hidden_size);
  const double expert = E * (glu * H * Fm + bias * ((glu - 1) * Fm + H)) / static_cast<double>(ep_etp);
  const double expert_f32 = E * bias * ((glu - 1) * Fm + H) / static_cast<double>(ep_etp);
  const std::vector<bool>& is_moe = c.is_moe_layer;
  MOE_ASSERT(std::ssize(is_moe) == c.num_layers);
  std::vector<StageLayers> chunks{StageLayers{0, c.num_layers, true, true, 0}};
  if (pp_rank >= 0 && c.pipeline_model_parallel_size > 1) chunks = pipeline_stage_layers(c, pp_rank);
  ParamCounts p;
  const bool untied = c.untie_embeddings_and_output_weights;
  // --fp8-param-gather: the decoder layers running FP8 GEMMs hold their GEMM weights as FP8 parameters.
  const bool fp8w = c.fp8_param_gather && !c.fp8_format.empty();
  const int64_t fp8_first = c.first_last_layers_bf16 ? c.num_layers_at_start_in_bf16 : 0;
  const int64_t fp8_end = c.num_layers - (c.first_last_layers_bf16 ? c.num_layers_at_end_in_bf16 : 0);
  for (const StageLayers& ch : chunks) {
    const double dense_before = p.dense, f32_before = p.f32_dense;
    if (ch.embedding) p.dense += V * H / t + positions;
    if (ch.embedding) p.f32_dense += V * H / t + positions;
    // The output layer: its own weight, or on a last stage without the embedding a copy of the tied one.
    if (ch.loss) p.dense += norm * H + ((untied || !ch.embedding) ? V * H / t : 0.0);
    if (ch.loss) p.f32_dense += norm * H + (!untied && !ch.embedding ? V * H / t : 0.0);
    if (ch.loss && !untied) p.bf16_copy += V * H / t;  // the tied weight read by the bf16 output GEMM
    p.ends += p.dense - dense_before;
    p.ends_f32 += p.f32_dense - f32_before;
    for (int64_t i = ch.first_layer; i < ch.first_layer + ch.num_layers; i++) {
      const bool m = is_moe[static_cast<size_t>(i)];
      p.dense += attn + (m ? moe_dense : dense_ffn);
      p.expert += m ? expert : 0.0;
      p.f32_dense += attn_f32 + (m ? moe_dense_f32 : dense_ffn_f32);
      p.f32_expert += m ? expert_f32 : 0.0;
      const double layer = attn + (m ? moe_dense + expert : dense_ffn);
      double fp8_dense = 0, fp8_expert = 0;
      if (fp8w && i >= fp8_first && i < fp8_end) {  // the GEMM weights: all but what stays f32
        fp8_dense = attn - attn_f32 + (m ? moe_dense - moe_dense_f32 : dense_ffn - dense_ffn_f32);
        fp8_expert = m ? expert - expert_f32 : 0.0;
      }
      p.fp8_dense += fp8_dense;
      p.fp8_expert += fp8_expert;
      if (layer > p.largest_layer) {
        p.largest_layer = layer;
        p.largest_layer_f32 = attn_f32 + (m ? moe_dense_f32 + expert_f32 : dense_ffn_f32);
        p.largest_layer_fp8 = fp8_dense + fp8_expert;
      }
    }
    if (ch.loss && c.mtp_num_layers > 0) {  // nn/mtp.h per depth: 3 norms, eh_proj (replicated), a last-kind layer
      const bool last_moe = is_moe.back();
      const double depths = static_cast<double>(c.mtp_num_layers);
      p.dense += depths * (3 * norm * H + 2 * H * H + attn + (last_moe ? moe_dense : dense_ffn));
      p.expert += last_moe ? depths * expert : 0.0;
      p.f32_dense += depths * (3 * norm * H + attn_f32 + (last_moe ? moe_dense_f32 : dense_ffn_f32));
      p.f32_expert += last_moe ? depths * expert_f32 : 0.0;
      // Untied, a last stage without the embedding keeps a copy of the word embedding for MTP's inputs.
      if (!ch.embedding && untied) p.dense += V * H / t;
      if (!ch.embedding && untied) p.f32_dense += V * H / t;
      p.ends += depths * (3 * norm * H + 2 * H * H + attn + (last_moe ? moe_dense + expert : dense_ffn)) +
                (!ch.embedding && untied ? V * H / t : 0.0);
      p.ends_f32 += depths * (3 * norm * H + attn_f32 + (last_moe ? moe_dense_f32 + expert_f32 : dense_ffn_f32)) +
                    (!ch.embedding && untied ? V * H / t : 0.0);
    }
  }
  return p;
}

MemoryPlan plan_memory(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, int64_t pp_rank,
                       const ParamCounts* measured) {
  const ParamCounts p = measured ? *measured : count_params(c, padded_vocab, l.tp, l.ep * l.etp, pp_rank);
  MemoryPlan m;
  m.pp_rank = pp_rank;
  const double n = p.dense + p.expert, dp = static_cast<double>(l.dp), edp = static_cast<double>(l.edp);
  m.params = n;
  // Megatron's --bf16 layout: the GEMM weights stored in bf16 in the model, their f32 masters only in the optimizer
  // (optim/adamw.cpp, distributed_optimizer.cpp); the parameters read in f32 (norms, biases, router, embeddings)
  // kept f32 and their own masters. Without --bf16 every parameter is f32 and its own master.
  const bool low = low_precision(c).has_value();  // --bf16 or --fp16: the same bytes
  const double n32 = low ? p.f32_dense + p.f32_expert : n, n16 = n - n32;
  const double dense16 = low ? p.dense - p.f32_dense : 0, expert16 = low ? p.expert - p.f32_expert : 0;
  m.weights = 2 * n16 + 4 * n32;
  m.grads = 4 * n;  // f32, in the optimizers' buckets where gradients cross ranks
  if (low) {        // a tied output layer's weight rounded once per step; the experts' packed copies (bf16)
    m.packed_weights = packed_expert_bytes(c, l, p.expert);
    m.bf16_weights = 2 * p.bf16_copy + m.packed_weights;
  }
  // One process has no data-parallel group: the plain AdamW. Over several ranks every part of the optimizer has its
  // group (possibly of one rank): the distributed optimizer keeps this rank's shard of the moments and of the bf16
  // parameters' masters, and reduces the gradients and gathers the parameters in place in their buckets
  // (optim/distributed_optimizer.cpp); the replicated one keeps them whole and all-reduces the buckets in place.
  // Adam's two moments: 4 bytes each, or 2 in bf16 (--use-precision-aware-optimizer --exp-avg-dtype bf16 ...).
  const bool aware = c.use_precision_aware_optimizer;
  const double moments = (aware && c.exp_avg_dtype == "bf16" ? 2 : 4) + (aware && c.exp_avg_sq_dtype == "bf16" ? 2 : 4);
  if (l.world() > 1 && c.use_distributed_optimizer) {
    const double over = dp * static_cast<double>(l.cp);  // dense over DP×CP, experts over EDP
    m.adam = moments * (p.dense / over + p.expert / edp);
    m.master = 4 * (dense16 / over + expert16 / edp);
  } else {
    m.adam = moments * n;
    m.master = 4 * n16;
  }
  // --fp8-param-gather: the FP8 weights held as f32 read-backs (not bf16), their f32 masters apart (without --bf16
  // too) and this rank's FP8 bytes of them (one per element; the owned shard under the distributed optimizer).
  const double fp8 = p.fp8_dense + p.fp8_expert;
  if (fp8 > 0) {
    const double own = l.world() > 1 && c.use_distributed_optimizer
                           ? p.fp8_dense / (dp * static_cast<double>(l.cp)) + p.fp8_expert / edp
                           : fp8;
    m.weights += (low ? 2 * fp8 : 0) + own;
    if (!low) m.master += 4 * own;
  }
  m.comm = 0;
  apply_fsdp(c, l, p, m);  // Megatron FSDP: what its strategy shards, and its units in flight
  // Sizes whose stash bytes do not fit in int64 (a sequence or batch of ~1e18 tokens) plan as unbounded: the
  // memory check then refuses them, instead of the byte counts overflowing.
  double widest = 1;
  for (const double w :
       {static_cast<double>(c.hidden_size), static_cast<double>(padded_vocab), static_cast<double>(c.ffn_hidden_size),
        static_cast<double>(c.moe_ffn_hidden_size), static_cast<double>(c.moe_shared_expert_intermediate_size),
        static_cast<double>(c.num_experts) * static_cast<double>(c.moe_router_topk),
        static_cast<double>(c.kv_channels) * static_cast<double>(c.num_attention_heads),
        static_cast<double>(c.q_lora_rank) * static_cast<double>(c.num_attention_heads),
        static_cast<double>(c.kv_lora_rank) * static_cast<double>(c.num_attention_heads)})
    widest = std::max(widest, w);
  if (static_cast<double>(c.seq_length) * static_cast<double>(c.micro_batch_size) * widest * 64 > 9e18) {
    m.peak_activations = m.activations = std::numeric_limits<double>::infinity();
    return m;
  }
  const StageActivations a = stage_activations(c, padded_vocab, l, pp_rank);
  for (double b : a.chunk_bytes) m.activations += b;
  m.logits = a.logits;
  m.in_flight = a.in_flight;
  m.peak_activations = a.peak;
  m.working = a.working;
  apply_activation_offload(c, padded_vocab, l, m);
  m.buffers = dispatch_buffers(c, l);
  // Pipeline P2P: the most messages of [S/TP, B, H] f32 alive at once on this stage.
  if (l.pp > 1) {
    const double act = static_cast<double>(nn::tensor_bytes(
        c.seq_length / std::max<int64_t>(l.cp, 1) / l.tp * c.micro_batch_size * c.hidden_size, DType::F32));
    m.comm += p2p_messages(c, l, pp_rank, a.in_flight) * act;
  }
  return m;
}

std::vector<MemoryPlan> plan_memory_stages(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l) {
  std::vector<MemoryPlan> v;
  for (int64_t r = 0; r < std::max<int64_t>(l.pp, 1); r++) v.push_back(plan_memory(c, padded_vocab, l, r));
  return v;
}

const MemoryPlan& worst_stage(const std::vector<MemoryPlan>& plans) {
  MOE_ASSERT(!plans.empty());
  return *std::max_element(plans.begin(), plans.end(),
                           [](const MemoryPlan& a, const MemoryPlan& b) { return a.total() < b.total(); });
}

MemoryLimit detect_memory_limit(int64_t ranks_on_node) {
  MemoryLimit l{0, ""};
  std::string source;
  std::optional<double> best;
  auto take = [&](std::optional<double> v, const std::string& s) {
    if (v && (!best || *v < *best)) {
      best = v;
      source = s;
    }
  };
  // This process's cgroup under the mount, or the mount's root (a container sees its own cgroup there).
  for (const std::string& dir : {"/sys/fs/cgroup" + cgroup_path(""), std::string("/sys/fs/cgroup")}) {
    std::string s2;
    take(cgroup_headroom(dir, "memory.max", "memory.current", s2), s2);
  }
  for (const std::string& dir :
       {"/sys/fs/cgroup/memory" + cgroup_path("memory"), std::string("/sys/fs/cgroup/memory")}) {
    std::string s1;
    take(cgroup_headroom(dir, "memory.limit_in_bytes", "memory.usage_in_bytes", s1), s1);
  }
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    double kb = 0;
    in >> kb;
    if (key == "MemAvailable:") take(kb * 1024, fmt::format("MemAvailable {}", human_bytes(kb * 1024)));
    in.ignore(1 << 20, '\n');
  }
  if (!best) return {1e300, "no limit found"};
  l.bytes = *best / static_cast<double>(std::max<int64_t>(1, ranks_on_node));
  l.source = ranks_on_node > 1 ? fmt::format("{}, shared by {} ranks on this node", source, ranks_on_node) : source;
  return l;
}

void check_memory_fits(const TrainConfig& c, const MemoryPlan& plan, const MemoryLimit& limit) {
  if (plan.total() <= limit.bytes) return;
  std::string advice =
      fmt::format("a smaller --micro-batch-size (now {}; activations and logits scale with it)", c.micro_batch_size);
  advice +=
      "; more ranks with --expert-model-parallel-size or --tensor-model-parallel-size (weights, gradients and "
      "Adam moments divide over them)";
  if (!c.use_distributed_optimizer)
    advice += "; --use-distributed-optimizer (Adam moments divide over the data-parallel ranks)";
  else if (!c.use_megatron_fsdp || c.data_parallel_sharding_strategy != "optim_grads_params")
    advice +=
        "; --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params (gradients and weights divide "
        "over the data-parallel ranks too)";
  if (c.recompute_granularity.empty())
    advice +=
        "; activation recompute (--recompute-granularity selective --recompute-modules moe_act layernorm, or "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)";
  MOE_CHECK(false,
            "the run cannot fit in memory: it plans {} per rank ({}), but this rank may use {} ({}). Try {}; or a "
            "smaller model",
            human_bytes(plan.total()), plan.describe(), human_bytes(limit.bytes), limit.source, advice);
}

MemoryPlan check_memory_before_start(const TrainConfig& c, int64_t padded_vocab, const ParallelGroups& g,
                                     std::FILE* out) {
  const int64_t world = g.world ? g.world->size() : 1;
  const MemoryPlan plan = plan_memory(c, padded_vocab, PlanLayout::from(c, world), g.pp_rank);
  MemoryLimit limit{static_cast<double>(c.testing_memory_limit), "--testing-memory-limit"};
  if (c.testing_memory_limit == 0) {
    int64_t local = 1;
    if (g.world && g.world->size() > 1) {  // ranks sharing this node's memory
      MPI_Comm node = MPI_COMM_NULL;
      MOE_MPI(MPI_Comm_split_type(g.world->comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
      int n = 1;
      MOE_MPI(MPI_Comm_size(node, &n));
      MOE_MPI(MPI_Comm_free(&node));
      local = n;
    }
    limit = detect_memory_limit(local);
  }
  check_memory_fits(c, plan, limit);
  fmt::print(out, "memory: this rank plans {} and may use {} ({})\n", human_bytes(plan.total()),
             human_bytes(limit.bytes), limit.source);
  return plan;
}

}  // namespace moecore::train
