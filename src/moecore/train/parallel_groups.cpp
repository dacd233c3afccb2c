// ParallelGroups (see parallel_groups.h).
#include "moecore/train/parallel_groups.h"

#include <numeric>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/context_parallel.h"

namespace moecore::train {

void ParallelGroups::make_context_parallel_groups(const TrainConfig& c, const comm::ProcessGroup& w) {
  cp = std::make_unique<comm::ProcessGroup>(w.split(mesh->cp));
  cp->set_name("cp");
  tp_cp = std::make_unique<comm::ProcessGroup>(w.split(mesh->tp_cp));
  tp_cp->set_name("tp-cp");
  cp_size = cp->size();
  cp_rank = cp->rank();
  const std::vector<int64_t> h = hierarchical_cp_sizes(c);
  if (cp_size == 1 || h.size() < 2) return;
  // Megatron's hierarchical groups: level 0 = consecutive CP ranks (the a2a), level 1 = those h[0] apart (p2p).
  comm::RankGroups inner, outer;
  for (const auto& g : mesh->cp) {
    for (size_t i = 0; i < g.size(); i += static_cast<size_t>(h[0]))
      inner.emplace_back(g.begin() + i, g.begin() + i + h[0]);
    for (int64_t j = 0; j < h[0]; j++) {
      outer.emplace_back();
      for (size_t i = static_cast<size_t>(j); i < g.size(); i += static_cast<size_t>(h[0]))
        outer.back().push_back(g[i]);
    }
  }
  cp_inner = std::make_unique<comm::ProcessGroup>(w.split(inner));
  cp_inner->set_name("cp-a2a");
  cp_outer = std::make_unique<comm::ProcessGroup>(w.split(outer));
  cp_outer->set_name("cp-p2p");
}

ParallelGroups::ParallelGroups(const TrainConfig& c, const comm::ProcessGroup* w) {
  const int64_t world_size = w ? w->size() : 1;
  if (world_size == 1 && c.expert_model_parallel_size == 1 && c.tensor_model_parallel_size == 1 &&
      c.expert_tensor_parallel_size <= 1 && c.pipeline_model_parallel_size == 1 && c.context_parallel_size == 1)
    return;
  // The two meshes over the ranks (CP is 1 in this build): attention TP×DP, experts ETP×EP×EDP folded
  // onto the same ranks. ParallelState rejects sizes the world cannot hold, a single process with EP > 1
  // included, so no parallel flag is ever silently ignored.
  mesh = std::make_unique<comm::ParallelState>(
      comm::ParallelSizes{world_size, c.tensor_model_parallel_size, c.pipeline_model_parallel_size,
                          c.context_parallel_size, c.expert_model_parallel_size, c.expert_tensor_parallel_size});
  MOE_ASSERT(w != nullptr);
  dp_size = mesh->dp;
  world_rank = w->rank();
  std::vector<int64_t> all(static_cast<size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  const std::pair<std::unique_ptr<comm::ProcessGroup>*, std::pair<const comm::RankGroups*, const char*>> groups[] = {
      {&dp, {&mesh->dp_cp, "dp"}},     {&tp_dp, {&mesh->tp_dp_cp, "tp-dp"}},
      {&ep, {&mesh->ep_groups, "ep"}}, {&edp, {&mesh->edp_groups, "edp"}},
      {&tp, {&mesh->tp, "tp"}},        {&etp, {&mesh->etp, "etp"}}};
  for (const auto& [g, spec] : groups) {
    *g = std::make_unique<comm::ProcessGroup>(w->split(*spec.first));
    (*g)->set_name(spec.second);
  }
  world = std::make_unique<comm::ProcessGroup>(w->split({all}));
  world->set_name("world");
  pp = std::make_unique<comm::ProcessGroup>(w->split(mesh->pp));
  pp->set_name("pp");
  pp_size = pp->size();
  pp_rank = pp->rank();
  if (pp_size > 1) {  // every rank takes part in the split; the middle stages' groups are discarded
    comm::RankGroups ends, middles;
    for (const auto& g : mesh->pp) {
      ends.push_back({g.front(), g.back()});
      if (g.size() > 2) middles.emplace_back(g.begin() + 1, g.end() - 1);
    }
    comm::RankGroups all_groups = ends;
    all_groups.insert(all_groups.end(), middles.begin(), middles.end());
    auto e = std::make_unique<comm::ProcessGroup>(w->split(all_groups));
    if (pp_rank == 0 || pp_rank == pp_size - 1) {
      embedding = std::move(e);
      embedding->set_name("embedding");
    }
  }
  make_context_parallel_groups(c, *w);
  dp_rank = dp->rank() / cp_size;  // DP×CP groups list CP fastest
  MOE_CHECK(c.global_batch_size % (c.micro_batch_size * dp_size) == 0,
            "--global-batch-size {} must be a multiple of --micro-batch-size {} x data-parallel size {}",
            c.global_batch_size, c.micro_batch_size, dp_size);
}

}  // namespace moecore::train
