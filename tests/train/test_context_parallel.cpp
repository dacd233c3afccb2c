// Context parallelism without ranks: the chunk split of tokens, labels and masks (rank r holds chunks r and
// 2C−1−r), global positions of local rows and their runs, RoPE table rows, the per-layer --cp-comm-type, and the
// refusals of bad combinations before any work (each message says what would fit).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config_util.h"
#include "moecore/nn/context_split.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/context_parallel.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using testing::user_error_of;

TEST(ContextSplit, RankHoldsChunksRAndMirror) {
  // S = 16, C = 4: 8 chunks of 2; rank 1 holds chunks 1 and 6 = positions 2,3,12,13.
  Tensor x = Tensor::empty({2, 16}, DType::I64);
  for (int64_t i = 0; i < 32; i++) x.data<int64_t>()[i] = i;
  const nn::SeqSplit s{4, 1};
  const Tensor y = nn::split_sequence_BS(x, s);
  ASSERT_EQ(y.shape(), Shape({2, 4}));
  const std::vector<int64_t> want{2, 3, 12, 13, 18, 19, 28, 29};
  for (int64_t i = 0; i < 8; i++) EXPECT_EQ(y.data<int64_t>()[i], want[static_cast<size_t>(i)]) << i;
  for (int64_t i = 0; i < 4; i++) EXPECT_EQ(s.position(i, 4), want[static_cast<size_t>(i)]);
  // Every position is held by exactly one rank.
  std::vector<int> seen(16, 0);
  for (int64_t r = 0; r < 4; r++)
    for (int64_t i = 0; i < 4; i++) seen[static_cast<size_t>(nn::SeqSplit{4, r}.position(i, 4))]++;
  for (int c : seen) EXPECT_EQ(c, 1);
  // Off: the tensor itself; an undefined mask stays undefined.
  EXPECT_EQ(nn::split_sequence_BS(x, {}).raw(), x.raw());
  EXPECT_FALSE(nn::split_sequence_BS(Tensor(), s).defined());
  EXPECT_NE(user_error_of([&] {
              nn::split_sequence_BS(Tensor::empty({1, 12}, DType::I64), s);
            }).find("does not split into 2 x --context-parallel-size 4 = 8 equal chunks"),
            std::string::npos);
}

TEST(ContextSplit, RunsAndTableRows) {
  const nn::SeqSplit s{2, 0};  // S = 8, L = 4: positions 0,1,6,7
  std::vector<std::vector<int64_t>> runs;
  s.runs(1, 2, 4, [&](int64_t r, int64_t p, int64_t n) { runs.push_back({r, p, n}); });  // a shard across the middle
  EXPECT_EQ(runs, (std::vector<std::vector<int64_t>>{{1, 1, 1}, {2, 6, 1}}));
  runs.clear();
  s.runs(2, 2, 4, [&](int64_t r, int64_t p, int64_t n) { runs.push_back({r, p, n}); });
  EXPECT_EQ(runs, (std::vector<std::vector<int64_t>>{{2, 6, 2}}));
  Tensor table = Tensor::empty({10, 3}, DType::F32);
  for (int64_t i = 0; i < 30; i++) table.data<float>()[i] = static_cast<float>(i);
  const Tensor rows = nn::rows_at_positions(table, 4, s);
  const std::vector<int64_t> pos{0, 1, 6, 7};
  for (int64_t i = 0; i < 4; i++)
    for (int64_t j = 0; j < 3; j++)
      EXPECT_EQ(rows.data<float>()[i * 3 + j], static_cast<float>(pos[static_cast<size_t>(i)] * 3 + j));
}

std::vector<std::string> base() {
  return std::vector<std::string>{"--mock-data", "--vocab-size",          "64", "--train-iters", "10", "--num-layers",
                                  "2",           "--num-attention-heads", "4",  "--seq-length",  "32"};
}
std::string refusal(const std::vector<std::string>& extra) {
  return user_error_of([&] { testing::small_config(base(), extra); });
}

TEST(ContextParallelFlags, CommTypesOnePerLayerOrOne) {
  const train::TrainConfig one =
      testing::small_config(base(), {"--context-parallel-size", "2", "--cp-comm-type", "a2a"});
  EXPECT_EQ(train::cp_comm_types(one), (std::vector<nn::CpCommType>{nn::CpCommType::A2A, nn::CpCommType::A2A}));
  const train::TrainConfig per =
      testing::small_config(base(), {"--context-parallel-size", "2", "--cp-comm-type", "p2p", "allgather"});
  EXPECT_EQ(train::cp_comm_types(per), (std::vector<nn::CpCommType>{nn::CpCommType::P2P, nn::CpCommType::AllGather}));
  const train::TrainConfig h = testing::small_config(
      base(),
      {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"});
  EXPECT_EQ(train::hierarchical_cp_sizes(h), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(testing::small_config(base()).cp_comm_type, (std::vector<std::string>{"p2p"}));  // Megatron's default
}

TEST(ContextParallelFlags, BadCombinationsAreRefusedWithWhatFits) {
  EXPECT_NE(refusal({"--context-parallel-size", "3"})
                .find("--seq-length 32 is not a multiple of 2 x "
                      "--context-parallel-size 3 = 6"),
            std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "3"}).find("use --seq-length 36"), std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "2", "--cp-comm-type", "p2p", "a2a", "a2a"})
                .find("--cp-comm-type has 3 values: give one for every layer or one per layer (2 for --num-layers 2)"),
            std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "4", "--hierarchical-context-parallel-sizes", "2", "3"})
                .find("multiply to 6, not --context-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p"})
                .find("a2a+p2p needs --hierarchical-context-parallel-sizes"),
            std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "8", "--cp-comm-type", "a2a", "--seq-length", "64"})
                .find("4 attention heads and 4 query groups per tensor-parallel rank do not split over the 8 ranks"),
            std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "2", "--hierarchical-context-parallel-sizes", "x"})
                .find("each size is an integer >= 1"),
            std::string::npos);
  EXPECT_NE(refusal({"--context-parallel-size", "2", "--tensor-model-parallel-size", "4", "--sequence-parallel",
                     "--disable-bias-linear", "--seq-length", "36"})
                .find("do not split over --tensor-model-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(refusal({"--cp-comm-type", "ring"}).find("ring"), std::string::npos);
  EXPECT_NE(refusal({"--hybrid-context-parallel"}).find("hybrid context parallelism"), std::string::npos);
  // Accepted: the sizes Megatron accepts (a world of one process refuses CP > 1 when the mesh is built).
  EXPECT_NO_THROW(testing::small_config(base(), {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                                                 "--hierarchical-context-parallel-sizes", "2", "2"}));
}

}  // namespace
}  // namespace moecore
