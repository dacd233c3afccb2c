// The combined 1F1B schedule's order under pipeline parallelism (pipeline_order with combined): Megatron's extra
// warm-up forward (get_pp_rank_microbatches), the steady-state pairs it merges, the same passes as the plain
// interleaved schedule; and a replay of every rank's steps under the rule the schedule runs a merged pair by (wait
// for both receives, compute, send both; pipeline_schedule.cpp) that runs every configuration to completion (no
// deadlock), where the order without the extra forward would merge a micro-batch's forward with its own backward.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/plan/step_time.h"

namespace moecore {
namespace {

using train::PipelinePass;

PipelinePass Fwd(int64_t m, int64_t c = 0, bool merged = false) {
  return {true, m, c, merged};
}
PipelinePass Bwd(int64_t m, int64_t c = 0) {
  return {false, m, c};
}

TEST(PipelineOrderCombined, MegatronsExtraWarmupForwardAndMergedPairs) {
  // PP2, v2, m4 on the first rank: warm-up (P−1)·2 + (v−1)·P + 1 = 5 forwards, then pairs F(k+5) | B(k).
  EXPECT_EQ(train::pipeline_order(4, 2, 0, 2, 0, false, true),
            (std::vector<PipelinePass>{Fwd(0, 0), Fwd(1, 0), Fwd(0, 1), Fwd(1, 1), Fwd(2, 0), Fwd(3, 0, true),
                                       Bwd(0, 1), Fwd(2, 1, true), Bwd(1, 1), Fwd(3, 1, true), Bwd(0, 0), Bwd(1, 0),
                                       Bwd(2, 1), Bwd(3, 1), Bwd(2, 0), Bwd(3, 0)}));
  // The last stage: 3 warm-up forwards.
  EXPECT_EQ(train::pipeline_order(4, 2, 1, 2, 0, false, true),
            (std::vector<PipelinePass>{Fwd(0, 0), Fwd(1, 0), Fwd(0, 1), Fwd(1, 1, true), Bwd(0, 1), Fwd(2, 0, true),
                                       Bwd(1, 1), Fwd(3, 0, true), Bwd(0, 0), Fwd(2, 1, true), Bwd(1, 0),
                                       Fwd(3, 1, true), Bwd(2, 1), Bwd(3, 1), Bwd(2, 0), Bwd(3, 0)}));
  // Without pipelining (combined_1f1b_schedule_for_no_pipelining): the first forward alone, then F(m) | B(m−1).
  EXPECT_EQ(train::pipeline_order(3, 1, 0, 1, 0, false, true),
            (std::vector<PipelinePass>{Fwd(0), Fwd(1, 0, true), Bwd(0), Fwd(2, 0, true), Bwd(1), Bwd(2)}));
  // The warm-up capped at every forward: nothing merged.
  for (const PipelinePass& p : train::pipeline_order(2, 2, 0, 2, 0, false, true)) EXPECT_FALSE(p.merged);
}

TEST(PipelineOrderCombined, SamePassesAndChunkOrderAsThePlainSchedule) {
  // Each chunk's forwards and backwards in the plain schedule's micro-batch order (gradients accumulate as there).
  for (int64_t P : {2, 3, 4})
    for (int64_t v : {2, 3})
      for (int64_t m : {P, 2 * P, 3 * P})
        for (int64_t r = 0; r < P; r++) {
          auto per_chunk = [&](const std::vector<PipelinePass>& o) {
            std::map<std::pair<int64_t, bool>, std::vector<int64_t>> s;
            for (const PipelinePass& p : o) s[{p.chunk, p.forward}].push_back(p.micro_batch);
            return s;
          };
          const auto plain = train::pipeline_order(m, P, r, v, 0),
                     combined = train::pipeline_order(m, P, r, v, 0, false, true);
          ASSERT_EQ(plain.size(), combined.size());
          EXPECT_EQ(per_chunk(plain), per_chunk(combined)) << P << " " << v << " " << m << " " << r;
          // Backwards in the same order overall (the optimizer's hooks fire as in the plain schedule).
          std::vector<PipelinePass> pb, cb;
          for (const PipelinePass& p : plain)
            if (!p.forward) pb.push_back(p);
          for (const PipelinePass& p : combined)
            if (!p.forward) cb.push_back(p);
          EXPECT_EQ(pb, cb);
        }
}

// Every rank's steps (a pass, or a merged forward and backward) replayed under the schedule's rules: a step starts
// once every message its passes receive has been sent (both receives before a merged pair), and sends at its end.
// Returns "" when every rank finishes, else what blocked.
std::string replay_combined_steps(int64_t m, int64_t P, int64_t v, int64_t group, bool extra_warmup) {
  using Key = std::tuple<int64_t, bool, int64_t, int64_t>;  // (rank, forward, micro-batch, chunk)
  std::vector<std::vector<std::vector<PipelinePass>>> steps(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; r++) {
    std::vector<PipelinePass> o = train::pipeline_order(m, P, r, v, group, false, true);
    if (!extra_warmup) {  // the plain warm-up, the same pairs merged: Megatron's order less its extra forward
      o = train::pipeline_order(m, P, r, v, group);
      for (size_t k = 0; k + 1 < o.size(); k++)
        if (o[k].forward && !o[k + 1].forward) o[k].merged = true;
    }
    for (size_t k = 0; k < o.size(); k++) {
      steps[static_cast<size_t>(r)].push_back({o[k]});
      if (o[k].merged) steps[static_cast<size_t>(r)].back().push_back(o[++k]);
    }
  }
  // The message a pass waits for: its input from the stage before (the last stage's previous chunk on the first
  // stage), or its output's gradient from the stage after (the first stage's next chunk on the last stage).
  auto needs = [&](int64_t r, const PipelinePass& p) -> std::optional<Key> {
    if (p.forward) {
      if (r == 0 && p.chunk == 0) return std::nullopt;
      return r > 0 ? Key{r - 1, true, p.micro_batch, p.chunk} : Key{P - 1, true, p.micro_batch, p.chunk - 1};
    }
    if (r == P - 1 && p.chunk == v - 1) return std::nullopt;
    return r < P - 1 ? Key{r + 1, false, p.micro_batch, p.chunk} : Key{0, false, p.micro_batch, p.chunk + 1};
  };
  std::set<Key> done;
  std::vector<size_t> at(static_cast<size_t>(P), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < P; r++) {
      auto& s = steps[static_cast<size_t>(r)];
      size_t& k = at[static_cast<size_t>(r)];
      if (k == s.size()) continue;
      const std::vector<PipelinePass>& step = s[k];
      if (step.size() == 2 && !done.count({r, true, step[1].micro_batch, step[1].chunk}))
        return "rank " + std::to_string(r) + " step " + std::to_string(k) +
               " merges a backward with its own micro-batch's forward";
      bool ready = true;
      for (const PipelinePass& p : step) {
        const auto n = needs(r, p);
        if (n && !done.count(*n)) ready = false;
      }
      if (!ready) continue;
      for (const PipelinePass& p : step) done.insert({r, p.forward, p.micro_batch, p.chunk});
      k++;
      progress = true;
    }
  }
  for (int64_t r = 0; r < P; r++)
    if (at[static_cast<size_t>(r)] != steps[static_cast<size_t>(r)].size())
      return "deadlock: rank " + std::to_string(r) + " blocked at step " + std::to_string(at[static_cast<size_t>(r)]);
  return "";
}

TEST(PipelineOrderCombined, EveryStageRunsToCompletionWaitingForBothReceivesOfAPair) {
  int64_t configurations = 0;
  for (int64_t P = 2; P <= 5; P++)
    for (int64_t v = 2; v <= 3; v++)
      for (int64_t m = P; m <= 12; m++)
        for (int64_t group = P; group <= m; group++) {
          const int64_t rest = m % group;
          if (rest != 0 && rest < P) continue;  // Megatron's rule on the last group
          EXPECT_EQ(replay_combined_steps(m, P, v, group, true), "")
              << "P " << P << " v " << v << " m " << m << " group " << group;
          configurations++;
        }
  EXPECT_GT(configurations, 200);
  // The replay can fail: without Megatron's extra warm-up forward the last stage's first pair is Fwd(0, v−1) | Bwd(0,
  // v−1).
  EXPECT_NE(replay_combined_steps(4, 2, 2, 2, false).find("merges a backward with its own micro-batch's forward"),
            std::string::npos);
}

// `moecore plan`'s pipeline simulation runs the combined order to the end (it asserts every pass ran), each rank
// busy for at least all its passes.
TEST(PipelineOrderCombined, PlanSimulationRunsTheCombinedOrder) {
  for (int64_t P : {2, 3, 4})
    for (int64_t v : {2, 3})
      for (int64_t m : {P, 2 * P}) {
        const std::vector<std::vector<double>> fwd(static_cast<size_t>(P), std::vector<double>(v, 1.0)),
            bwd(static_cast<size_t>(P), std::vector<double>(v, 2.0));
        const std::vector<double> end = train::plan::simulate_pipeline(m, P, v, 0, fwd, bwd, 0.0, true);
        for (double e : end) EXPECT_GE(e, 3.0 * static_cast<double>(m * v));
      }
}

}  // namespace
}  // namespace moecore
