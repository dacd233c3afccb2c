// RankGenerator and ParallelState reproduce the reference's worked examples (§2.2, §2.3) group by group.
#include <gtest/gtest.h>

#include "moecore/comm/rank_generator.h"
#include "moecore/core/error.h"

namespace moecore {
namespace {

using comm::RankGroups;

RankGroups seq(int64_t n, int64_t len, int64_t stride_between, int64_t stride_within) {
  RankGroups g;
  for (int64_t i = 0; i < n; i++) {
    std::vector<int64_t> x;
    for (int64_t j = 0; j < len; j++) x.push_back(i * stride_between + j * stride_within);
    g.push_back(x);
  }
  return g;
}

TEST(RankGenerator, WorkedExampleA) {
  // World 16; dense TP2 CP1 PP2 DP4; experts ETP1 EP4 PP2 EDP2.
  comm::ParallelState ps({16, 2, 2, 1, 4, 1});
  EXPECT_EQ(ps.dp, 4);
  EXPECT_EQ(ps.edp, 2);
  EXPECT_EQ(ps.tp, seq(8, 2, 2, 1));
  EXPECT_EQ(ps.cp.size(), 16u);
  EXPECT_EQ(ps.dp_groups, (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(ps.dp_cp, ps.dp_groups);
  EXPECT_EQ(ps.pp, (RankGroups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(ps.tp_pp, (RankGroups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(ps.tp_dp_cp, (RankGroups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(ps.etp.size(), 16u);
  EXPECT_EQ(ps.ep_groups, (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(ps.etp_ep, ps.ep_groups);
  EXPECT_EQ(ps.edp_groups, (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(ps.etp_ep_pp, (RankGroups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
  EXPECT_EQ(ps.expert_pp, ps.pp);
  // Rank 5 is EP rank 1 of [4,5,6,7]; its EDP peer is rank 1.
  EXPECT_EQ(comm::ParallelState::index_in(comm::ParallelState::group_of(ps.ep_groups, 5), 5), 1);
  EXPECT_EQ(comm::ParallelState::group_of(ps.edp_groups, 5), (std::vector<int64_t>{1, 5}));
}

TEST(RankGenerator, WorkedExampleB) {
  // World 16; dense TP2 CP2 DP2 PP2.
  comm::ParallelState b1({16, 2, 2, 2, 8, 1});  // experts ETP1 EP8 EDP1
  EXPECT_EQ(b1.cp, (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(b1.dp_groups, (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(b1.dp_cp, (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(b1.tp_cp, (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(b1.ep_groups, (RankGroups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(b1.edp_groups.size(), 16u);
  comm::ParallelState b2({16, 2, 2, 2, 2, 2});  // experts ETP2 EP2 EDP2
  EXPECT_EQ(b2.etp, seq(8, 2, 2, 1));
  EXPECT_EQ(b2.ep_groups[0], (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(b2.ep_groups[1], (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(b2.ep_groups[2], (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(b2.etp_ep[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(b2.edp_groups[0], (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(b2.edp_groups[4], (std::vector<int64_t>{8, 12}));
}

TEST(RankGenerator, PpNotLastGivesDifferentPipelineGroups) {
  comm::RankGenerator dense(2, 1, 2, 2, 2, "tp-cp-ep-pp-dp");
  EXPECT_EQ(dense.get_ranks("pp")[0], (std::vector<int64_t>{0, 4}));
}

TEST(RankGenerator, IncompatibleSizesAreRejected) {
  try {
    comm::ParallelState({6, 4, 1, 1, 1, 0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm::ParallelState({8, 1, 1, 1, 3, 1}), Error);  // 8 % 3
  EXPECT_NO_THROW(comm::ParallelState({1, 1, 1, 1, 1, 0}));
}

}  // namespace
}  // namespace moecore
