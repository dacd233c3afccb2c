// The process groups one training run talks over, built once from the layout flags: the dense mesh (TP, DP×CP,
// TP×DP×CP) and the folded expert mesh (EP, ETP, EDP) over the same ranks (reference: RankGenerator). What each
// group carries is decided elsewhere (optim/ for gradients, moe/ for tokens, train/metrics for statistics).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moecore/comm/process_group.h"

namespace moecore::train {

struct TrainConfig;

struct ParallelGroups {
  // Null for a single process (no mesh, no groups); otherwise every group exists, possibly of one rank.
  std::unique_ptr<comm::ParallelState> mesh;
  std::unique_ptr<comm::ProcessGroup> dp, tp_dp, ep, edp, tp, etp, world;
  // Pipeline parallelism: the pipeline group (this rank's stages, in stage order) and Megatron's embedding group
  // (the first and last stage, which share the tied word embedding; null when PP is 1 or this rank is on neither).
  std::unique_ptr<comm::ProcessGroup> pp, embedding;
  // Context parallelism: the CP group (attention), TP×CP (the router's aux-loss and z-loss statistics), and for
  // a2a+p2p the inner (a2a) and outer (p2p) groups of --hierarchical-context-parallel-sizes. `dp` above is DP×CP
  // (gradients, the distributed optimizer, loss sums); dp_size and dp_rank are the pure DP ones (data sharding).
  std::unique_ptr<comm::ProcessGroup> cp, tp_cp, cp_inner, cp_outer;
  int64_t cp_size = 1, cp_rank = 0;
  int64_t dp_size = 1, dp_rank = 0, world_rank = 0, pp_size = 1, pp_rank = 0;

  // Builds the meshes over `world` (null or one rank: a single process unless a layout flag asks for more, which
  // ParallelState then refuses). Checks that the global batch splits over data parallelism.
  ParallelGroups(const TrainConfig& c, const comm::ProcessGroup* world);

  bool distributed() const { return mesh != nullptr; }
  void make_context_parallel_groups(const TrainConfig& c, const comm::ProcessGroup& w);
  // Size of a group (1 when absent).
  static int64_t size(const std::unique_ptr<comm::ProcessGroup>& g) { return g ? g->size() : 1; }
  // The group when it has more than one rank (what modules take), else null.
  static const comm::ProcessGroup* active(const std::unique_ptr<comm::ProcessGroup>& g) {
    return g && g->size() > 1 ? g.get() : nullptr;
  }
};

}  // namespace moecore::train
