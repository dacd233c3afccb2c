// Memory before work (see memory_plan.h): the plan from the configuration, the limit from the cgroup and
// /proc/meminfo, and the refusal. Not here: the allocator's own out-of-memory error (core/allocator.cpp), the
// printed plan with the built model's exact parameter count (metrics.cpp, print_memory_plan).
#include "moecore/train/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "moecore/comm/mpi_check.h"
#include "moecore/core/error.h"
#include "moecore/train/metrics.h"
#include "moecore/train/parallel_groups.h"

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
  return fmt::format("weights {} | gradients {} | Adam moments {} | activations per micro-batch ~{} | logits {}",
                     human_bytes(weights), human_bytes(grads), human_bytes(adam), human_bytes(activations),
                     human_bytes(logits));
}

ParamCounts count_params(const TrainConfig& c, int64_t padded_vocab, int64_t tp, int64_t ep_etp) {
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.kv_channels);
  const double N = static_cast<double>(c.num_attention_heads), G = static_cast<double>(c.num_query_groups);
  const double V = static_cast<double>(padded_vocab), L = static_cast<double>(c.num_layers);
  const double glu = c.swiglu ? 3.0 : 2.0, bias = c.disable_bias_linear ? 0.0 : 1.0;
  const double norm = c.normalization == "LayerNorm" ? 2.0 : 1.0;  // weight (+ bias) per norm
  const double positions =
      c.position_embedding_type == "learned_absolute" ? static_cast<double>(c.max_position_embeddings) * H : 0.0;
  double attn =
      H * (N + 2 * G) * D + N * D * H + norm * (2 * H + (c.qk_layernorm ? 2 * D : 0)) + bias * ((N + 2 * G) * D + H);
  if (c.multi_latent_attention) {  // nn/mla_attention.h: down, up and output projections, latent norms
    const double Q = static_cast<double>(c.q_lora_rank), R = static_cast<double>(c.kv_lora_rank);
    const double Dq = static_cast<double>(c.qk_head_dim + c.qk_pos_emb_head_dim);
    const double Dr = static_cast<double>(c.qk_pos_emb_head_dim), Dv = static_cast<double>(c.v_head_dim);
    attn = (Q > 0 ? H * Q + Q * N * Dq : H * N * Dq) + H * (R + Dr) + R * N * (Dq - Dr + Dv) + N * Dv * H +
           norm * (2 * H + (c.qk_layernorm ? Q + R : 0)) + bias * H;
  }
  const double dense_ffn = glu * H * static_cast<double>(c.ffn_hidden_size) + bias * (H + glu / 2 * H);
  double moe_layers = 0;
  if (c.num_experts > 0)
    for (bool m : moe::parse_moe_layer_freq(c.moe_layer_freq, c.num_layers)) moe_layers += m ? 1 : 0;
  const double E = static_cast<double>(c.num_experts), Fs = static_cast<double>(c.moe_shared_expert_intermediate_size);
  const double moe_dense = E * H + glu * H * Fs + (c.moe_shared_expert_gate ? H : 0);
  ParamCounts p;
  p.dense = V * H * (c.untie_embeddings_and_output_weights ? 2 : 1) + positions + norm * H + L * attn +
            (L - moe_layers) * dense_ffn + moe_layers * moe_dense;
  p.expert = moe_layers * E * glu * H * static_cast<double>(c.moe_ffn_hidden_size);
  if (c.mtp_num_layers > 0) {  // nn/mtp.h per depth: enorm, hnorm, final norm, eh_proj, a layer of the last's kind
    const bool last_moe = c.num_experts > 0 && moe::parse_moe_layer_freq(c.moe_layer_freq, c.num_layers).back();
    const double Dm = static_cast<double>(c.mtp_num_layers);
    p.dense += Dm * (3 * norm * H + 2 * H * H + attn + (last_moe ? moe_dense : dense_ffn));
    if (last_moe) p.expert += Dm * E * glu * H * static_cast<double>(c.moe_ffn_hidden_size);
  }
  p.dense /= static_cast<double>(tp);
  p.expert /= static_cast<double>(ep_etp);
  return p;
}

MemoryPlan plan_memory(const TrainConfig& c, const ParamCounts& p, int64_t padded_vocab, int64_t tp, int64_t dp,
                       int64_t edp) {
  MemoryPlan m;
  const double n = p.dense + p.expert;
  m.weights = 4 * n;
  m.grads = 4 * n;
  // [context parallelism] each rank holds S/CP positions of each sequence (activations and logits fall as 1/CP),
  // and the distributed optimizer shards dense state over DP×CP.
  const double cp = static_cast<double>(c.context_parallel_size);
  m.adam = c.use_distributed_optimizer
               ? 8 * (p.dense / (static_cast<double>(dp) * cp) + p.expert / static_cast<double>(edp))
               : 8 * n;
  // Activations kept per micro-batch, estimated from the stash contents of each layer; sequence-parallel and
  // vocabulary-parallel under TP.
  const double T = static_cast<double>(c.seq_length) * static_cast<double>(c.micro_batch_size) / cp;
  const double H = static_cast<double>(c.hidden_size), t = static_cast<double>(tp);
  const double qkv =
      static_cast<double>(c.kv_channels) * (static_cast<double>(c.num_attention_heads) + 2.0 * c.num_query_groups);
  double ffn_act = 3.0 * static_cast<double>(c.ffn_hidden_size);
  if (c.num_experts > 0)
    ffn_act = static_cast<double>(c.moe_router_topk) * (H + 3.0 * static_cast<double>(c.moe_ffn_hidden_size)) +
              static_cast<double>(c.num_experts);
  const double per_layer = T * (6 * H + 2 * qkv + ffn_act) * 4.0 / t;
  const int64_t L = c.num_layers, chunk = c.recompute_num_layers;
  m.activations = per_layer * static_cast<double>(L);
  if (c.recompute_granularity == "full" && chunk > 0) {
    // Full recompute keeps each chunk's input; backward holds one replayed chunk's stashes at a time, the later
    // layers' already freed. (Selective recompute is not counted here: the plan stays an upper bound.)
    const double input = T * H * 4.0 / t;
    if (c.recompute_method == "block") {
      const int64_t r = std::min(chunk, L);
      m.activations = input * static_cast<double>(r) + per_layer * static_cast<double>(std::max<int64_t>(L - r, r > 0));
    } else {
      m.activations =
          input * static_cast<double>((L + chunk - 1) / chunk) + per_layer * static_cast<double>(std::min(chunk, L));
    }
  }
  m.logits = T * static_cast<double>(padded_vocab) * 4.0 / t;
  return m;
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
  using PG = ParallelGroups;
  const int64_t tp = PG::size(g.tp), ep_etp = PG::size(g.ep) * PG::size(g.etp);
  const MemoryPlan plan =
      plan_memory(c, count_params(c, padded_vocab, tp, ep_etp), padded_vocab, tp, g.dp_size, PG::size(g.edp));
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
