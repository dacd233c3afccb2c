// RankGenerator and ParallelState (see rank_generator.h), following Megatron's
// generate_masked_orthogonal_rank_groups and initialize_model_parallel.
#include "moecore/comm/rank_generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "moecore/core/error.h"

namespace moecore::comm {

namespace {
std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, '-'))
    if (!t.empty()) out.push_back(t);
  return out;
}
}  // namespace

RankGenerator::RankGenerator(int64_t tp, int64_t ep, int64_t dp, int64_t pp, int64_t cp, const std::string& order,
                             int64_t rank_offset)
    : offset_(rank_offset) {
  MOE_ASSERT_MSG(ep == 1 || cp == 1, "a rank generator has either EP or CP, got ep={} cp={}", ep, cp);
  const std::vector<std::pair<std::string, int64_t>> all = {{"tp", tp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}};
  names_ = split_tokens(order);
  for (const auto& [name, size] : all) {
    MOE_ASSERT(size >= 1);
    if (std::find(names_.begin(), names_.end(), name) == names_.end()) {
      MOE_CHECK(size == 1, "parallel order '{}' lacks '{}' whose size is {}", order, name, size);
      names_.push_back(name);
    }
  }
  for (const auto& n : names_) {
    auto it = std::find_if(all.begin(), all.end(), [&](const auto& p) { return p.first == n; });
    MOE_CHECK(it != all.end(), "unknown axis '{}' in parallel order '{}'", n, order);
    sizes_.push_back(it->second);
    world_ *= it->second;
  }
}

RankGroups RankGenerator::get_ranks(const std::string& tokens) const {
  const auto want = split_tokens(tokens);
  std::vector<int64_t> stride(sizes_.size());
  int64_t s = 1;
  for (size_t i = 0; i < sizes_.size(); i++) {
    stride[i] = s;
    s *= sizes_[i];
  }
  std::vector<int64_t> m_shape, m_stride, u_shape, u_stride;
  for (size_t i = 0; i < names_.size(); i++) {
    const bool masked = std::find(want.begin(), want.end(), names_[i]) != want.end();
    (masked ? m_shape : u_shape).push_back(sizes_[i]);
    (masked ? m_stride : u_stride).push_back(stride[i]);
  }
  for (const auto& w : want)
    MOE_ASSERT_MSG(std::find(names_.begin(), names_.end(), w) != names_.end(), "no axis {}", w);
  int64_t group_size = 1;
  for (int64_t x : m_shape) group_size *= x;
  const int64_t num_groups = world_ / group_size;
  // Mixed-radix decomposition, first dimension fastest.
  auto decompose = [](int64_t idx, const std::vector<int64_t>& shape) {
    std::vector<int64_t> c(shape.size());
    for (size_t i = 0; i < shape.size(); i++) {
      c[i] = idx % shape[i];
      idx /= shape[i];
    }
    return c;
  };
  RankGroups groups;
  for (int64_t g = 0; g < num_groups; g++) {
    const auto u = decompose(g, u_shape);
    int64_t base = offset_;
    for (size_t i = 0; i < u.size(); i++) base += u[i] * u_stride[i];
    std::vector<int64_t> group;
    for (int64_t r = 0; r < group_size; r++) {
      const auto m = decompose(r, m_shape);
      int64_t rank = base;
      for (size_t i = 0; i < m.size(); i++) rank += m[i] * m_stride[i];
      group.push_back(rank);
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

ParallelState::ParallelState(const ParallelSizes& s) : sizes(s) {
  if (sizes.etp == 0) sizes.etp = sizes.tp;
  const int64_t W = sizes.world;
  const int64_t dense = sizes.tp * sizes.pp * sizes.cp;
  MOE_CHECK(W % dense == 0,
            "world size {} is not divisible by --tensor-model-parallel-size {} x --pipeline-model-parallel-size {} x "
            "--context-parallel-size {} = {}",
            W, sizes.tp, sizes.pp, sizes.cp, dense);
  const int64_t expert = sizes.etp * sizes.ep * sizes.pp;
  MOE_CHECK(W % expert == 0,
            "world size {} is not divisible by --expert-tensor-parallel-size {} x --expert-model-parallel-size {} x "
            "--pipeline-model-parallel-size {} = {}",
            W, sizes.etp, sizes.ep, sizes.pp, expert);
  dp = W / dense;
  edp = W / expert;
  const RankGenerator d(sizes.tp, 1, dp, sizes.pp, sizes.cp);
  const RankGenerator e(sizes.etp, sizes.ep, edp, sizes.pp, 1);
  tp = d.get_ranks("tp");
  cp = d.get_ranks("cp");
  dp_groups = d.get_ranks("dp");
  dp_cp = d.get_ranks("dp-cp");
  pp = d.get_ranks("pp");
  tp_pp = d.get_ranks("tp-pp");
  tp_cp = d.get_ranks("tp-cp");
  tp_dp_cp = d.get_ranks("tp-dp-cp");
  etp = e.get_ranks("tp");
  ep_groups = e.get_ranks("ep");
  etp_ep = e.get_ranks("tp-ep");
  etp_ep_pp = e.get_ranks("tp-ep-pp");
  edp_groups = e.get_ranks("dp");
  expert_pp = e.get_ranks("pp");
  MOE_CHECK(expert_pp == pp,
            "the expert mesh's pipeline groups differ from the dense mesh's; with order "
            "tp-cp-ep-dp-pp this cannot happen unless sizes are inconsistent");
}

const std::vector<int64_t>& ParallelState::group_of(const RankGroups& groups, int64_t rank) {
  for (const auto& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  MOE_ASSERT_MSG(false, "rank {} is in no group", rank);
  return groups.front();
}

int64_t ParallelState::index_in(const std::vector<int64_t>& group, int64_t rank) {
  const auto it = std::find(group.begin(), group.end(), rank);
  MOE_ASSERT(it != group.end());
  return it - group.begin();
}

std::string ParallelState::describe() const {
  auto line = [](const char* name, const RankGroups& g) {
    std::string s = fmt::format("  {:<10}", name);
    for (size_t i = 0; i < g.size() && i < 8; i++) {
      s += " [";
      for (size_t j = 0; j < g[i].size(); j++) s += (j ? "," : "") + std::to_string(g[i][j]);
      s += "]";
    }
    if (g.size() > 8) s += fmt::format(" ... ({} groups)", g.size());
    return s + "\n";
  };
  std::string s = fmt::format("parallel mesh: world {} | dense TP{} CP{} DP{} PP{} | expert ETP{} EP{} EDP{} PP{}\n",
                              sizes.world, sizes.tp, sizes.cp, dp, sizes.pp, sizes.etp, sizes.ep, edp, sizes.pp);
  s += line("TP", tp) + line("CP", cp) + line("DP", dp_groups) + line("DPxCP", dp_cp) + line("PP", pp) +
       line("TPxCP", tp_cp) + line("TPxDPxCP", tp_dp_cp) + line("ETP", etp) + line("EP", ep_groups) +
       line("ETPxEP", etp_ep) + line("EDP", edp_groups);
  return s;
}

}  // namespace moecore::comm
