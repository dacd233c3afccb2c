// Context parallelism's flag checks (see context_parallel.h).
#include "moecore/train/config/context_parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

nn::CpCommType parse_cp_comm_type(const std::string& s) {
  if (s == "p2p") return nn::CpCommType::P2P;
  if (s == "a2a") return nn::CpCommType::A2A;
  if (s == "allgather") return nn::CpCommType::AllGather;
  MOE_CHECK(s == "a2a+p2p", "--cp-comm-type {}: use p2p, a2a, allgather or a2a+p2p", s);
  return nn::CpCommType::A2AP2P;
}

std::vector<int64_t> hierarchical_cp_sizes(const TrainConfig& c) {
  std::vector<int64_t> v;
  for (const std::string& s : c.hierarchical_context_parallel_sizes) {
    size_t used = 0;
    int64_t x = 0;
    try {
      x = std::stoll(s, &used);
    } catch (...) {
      used = 0;
    }
    MOE_CHECK(used == s.size() && x >= 1, "--hierarchical-context-parallel-sizes {}: each size is an integer >= 1", s);
    v.push_back(x);
  }
  return v;
}

std::vector<nn::CpCommType> cp_comm_types(const TrainConfig& c) {
  std::vector<nn::CpCommType> t;
  for (const std::string& s : c.cp_comm_type) t.push_back(parse_cp_comm_type(s));
  if (t.size() == 1) t.assign(static_cast<size_t>(c.num_layers), t[0]);
  return t;
}

void check_context_parallel(const TrainConfig& c) {
  const int64_t C = c.context_parallel_size, tp = c.tensor_model_parallel_size;
  MOE_CHECK(!c.cp_comm_type.empty(), "--cp-comm-type needs a value: p2p, a2a, allgather or a2a+p2p");
  const std::vector<int64_t> h = hierarchical_cp_sizes(c);
  // Megatron's argument checks (hold whatever the size).
  if (!h.empty()) {
    int64_t prod = 1;
    for (int64_t x : h) prod *= x;
    MOE_CHECK(prod == C,
              "--hierarchical-context-parallel-sizes {} multiply to {}, not --context-parallel-size {}: give sizes "
              "whose product is {} (a2a+p2p: the a2a group size, then the p2p group size)",
              fmt::join(c.hierarchical_context_parallel_sizes, " "), prod, C, C);
  }
  const bool a2a_p2p = std::find(c.cp_comm_type.begin(), c.cp_comm_type.end(), "a2a+p2p") != c.cp_comm_type.end();
  MOE_CHECK(!a2a_p2p || !h.empty(),
            "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes (the a2a and the p2p group sizes, "
            "product --context-parallel-size {}), or use p2p, a2a or allgather",
            C);
  if (C == 1) return;
  MOE_CHECK(C <= c.seq_length / 2,
            "--context-parallel-size {} cuts --seq-length {} into 2x{} chunks: use at most {} (each chunk one token)",
            C, c.seq_length, C, c.seq_length / 2);
  MOE_CHECK(c.cp_comm_type.size() == 1 || static_cast<int64_t>(c.cp_comm_type.size()) == c.num_layers,
            "--cp-comm-type has {} values: give one for every layer or one per layer ({} for --num-layers {})",
            c.cp_comm_type.size(), c.num_layers, c.num_layers);
  MOE_CHECK(c.seq_length % (2 * C) == 0,
            "--seq-length {} is not a multiple of 2 x --context-parallel-size {} = {} (each sequence is cut into "
            "2xCP equal chunks): use --seq-length {} or a --context-parallel-size dividing {}",
            c.seq_length, C, 2 * C, (c.seq_length / (2 * C) + 1) * 2 * C, c.seq_length / 2);
  MOE_CHECK((c.seq_length / C) % tp == 0,
            "--seq-length {} / --context-parallel-size {} = {} positions per CP rank do not split over "
            "--tensor-model-parallel-size {} (sequence parallelism): use a --seq-length that is a multiple of {}",
            c.seq_length, C, c.seq_length / C, tp, std::lcm(2 * C, C * tp));
  // Transformer Engine's all-to-all turns sequence shards into head shards: this rank's heads (and key-value
  // groups) must split over the a2a group.
  const int64_t heads = c.num_attention_heads / tp, groups = c.num_query_groups / tp;
  for (const std::string& t : c.cp_comm_type) {
    if (t != "a2a" && t != "a2a+p2p") continue;
    const int64_t a = t == "a2a" ? C : h.at(0);
    MOE_CHECK(heads % a == 0 && groups % a == 0,
              "--cp-comm-type {}: {} attention heads and {} query groups per tensor-parallel rank do not split over "
              "the {} ranks of the all-to-all: use p2p or allgather, or heads and --num-query-groups divisible by "
              "{} x --tensor-model-parallel-size {}",
              t, heads, groups, a, a, tp);
  }
}

}  // namespace moecore::train
