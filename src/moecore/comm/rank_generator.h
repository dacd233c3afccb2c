// Megatron-Core's RankGenerator (reference §2): global rank = Σ coord[axis] · stride[axis] with the axes in the
// order string ("tp-cp-ep-dp-pp", leftmost fastest), and a group is every rank sharing all coordinates but the
// named ones. ParallelState lays the dense mesh TP×CP×DP×PP and the expert mesh ETP×EP×EDP×PP over the same ranks
// (Parallel Folding) and lists every derived group. Pure arithmetic: no communication here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::comm {

using RankGroups = std::vector<std::vector<int64_t>>;

class RankGenerator {
 public:
  RankGenerator(int64_t tp, int64_t ep, int64_t dp, int64_t pp, int64_t cp, const std::string& order = "tp-cp-ep-dp-pp",
                int64_t rank_offset = 0);
  int64_t world_size() const { return world_; }
  // Groups for a token set such as "tp", "dp-cp", "tp-ep-pp" (order of tokens in the argument does not matter).
  RankGroups get_ranks(const std::string& tokens) const;

 private:
  std::vector<std::string> names_;
  std::vector<int64_t> sizes_;
  int64_t world_ = 1, offset_ = 0;
};

struct ParallelSizes {
  int64_t world = 1, tp = 1, pp = 1, cp = 1, ep = 1, etp = 0;  // etp 0: equal to tp (Megatron's default)
};

// Every group of the two meshes, checked for consistency. Throws Error naming the sizes when they do not divide.
struct ParallelState {
  ParallelSizes sizes;
  int64_t dp = 1, edp = 1;
  RankGroups tp, cp, dp_groups, dp_cp, pp, tp_pp, tp_cp, tp_dp_cp;      // dense mesh
  RankGroups etp, ep_groups, etp_ep, etp_ep_pp, edp_groups, expert_pp;  // expert mesh
  explicit ParallelState(const ParallelSizes& s);
  // The group of `kind` that contains `rank`, and the rank's position in it.
  static const std::vector<int64_t>& group_of(const RankGroups& groups, int64_t rank);
  static int64_t index_in(const std::vector<int64_t>& group, int64_t rank);
  // A table of the groups, printed at start.
  std::string describe() const;
};

}  // namespace moecore::comm
