// plan_pipeline over many (layers, PP, virtual stages, first, last, account-for) combinations: every layer on exactly
// one stage, in order, and accepted exactly where a line-by-line transcription of Megatron's checks and formulas
// builds every layer once (with the same stages). And the flags through the flag pass and --help.
#include <gtest/gtest.h>

#include <optional>

#include "config_util.h"
#include "moecore/train/config/config.h"
#include "moecore/train/pipeline/pipeline_layout.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using train::PipelineFlags;
using train::PipelineLayout;

PipelineFlags sweep_flags(int64_t layers, int64_t pp) {
  PipelineFlags f;
  f.num_layers = layers;
  f.pp = pp;
  return f;
}

// Python's // and %.
int64_t py_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0 && ((a < 0) != (b < 0))) ? 1 : 0);
}
int64_t py_mod(int64_t a, int64_t b) {
  return a - py_div(a, b) * b;
}

// Megatron's checks and formulas transcribed line by line (arguments.py's pipeline block, TransformerConfig's uneven
// and account-for checks, get_num_layers_to_build, get_transformer_layer_offset): (first layer, layers) per stage in
// model-chunk order, or nothing where Megatron raises. `zero_division` is set where only the offset's division by
// zero middle stages raises (PP 2 x VPP with both ends set).
std::optional<std::vector<std::pair<int64_t, int64_t>>> megatron(const PipelineFlags& f, bool& zero_division) {
  const int64_t L = f.num_layers, pp = f.pp, e = f.account_for_embedding, l = f.account_for_loss;
  const bool first = f.decoder_first_pipeline_num_layers != -1, last = f.decoder_last_pipeline_num_layers != -1;
  const int64_t fl = f.decoder_first_pipeline_num_layers, ll = f.decoder_last_pipeline_num_layers;
  const int64_t lpvs = f.num_layers_per_virtual_stage, nvs = f.num_virtual_stages_per_rank;
  zero_division = false;
  if (lpvs != -1 && nvs != -1) return std::nullopt;
  int64_t vpp = 0;  // None
  if (lpvs != -1 || nvs != -1) {
    if (nvs == -1) {
      if (first || last) return std::nullopt;
      if ((L + e + l) % pp != 0) return std::nullopt;
      const int64_t per = (L + e + l) / pp;
      if (per % lpvs != 0) return std::nullopt;
      vpp = per / lpvs;
    } else {
      vpp = nvs;
    }
    if (vpp == 1) vpp = 0;
  } else if (!first && !last && (L + e + l) % pp != 0) {
    return std::nullopt;
  }
  if (vpp != 0 && !(pp > 1)) return std::nullopt;
  if ((first || last) && (e || l)) return std::nullopt;
  if (first || last) {
    int64_t n = L, stages = pp;
    if (first) {
      if (fl <= 0 || (vpp != 0 && fl % vpp != 0)) return std::nullopt;
      n -= fl, stages -= 1;
    }
    if (last) {
      if (ll <= 0 || (vpp != 0 && ll % vpp != 0)) return std::nullopt;
      n -= ll, stages -= 1;
    }
    if ((n != 0) != (stages != 0)) return std::nullopt;
    if (stages != 0 && py_mod(n, stages) != 0) return std::nullopt;
    if (stages != 0 && vpp != 0 && py_mod(py_div(n, stages), vpp) != 0) return std::nullopt;
  } else if (e || l) {
    if ((L + e + l) % pp != 0) return std::nullopt;
    if (vpp != 0 && ((L + e + l) / pp) % vpp != 0) return std::nullopt;
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t v = 0; v < std::max<int64_t>(vpp, 1); v++)
    for (int64_t r = 0; r < pp; r++) {
      int64_t per_rank = 0;  // get_num_layers_to_build
      if (first || last) {
        int64_t left = L, stages = pp;
        if (first) left -= fl, stages -= 1;
        if (last) left -= ll, stages -= 1;
        if (stages > 0) {
          if (py_mod(left, stages) != 0) return std::nullopt;
          per_rank = py_div(left, stages);
        }
        if (r == 0 && first) per_rank = fl;
        if (r == pp - 1 && last) per_rank = ll;
      } else {
        if ((L + e + l) % pp != 0) return std::nullopt;
        per_rank = (L + e + l) / pp;
      }
      int64_t build = per_rank;
      if (vpp != 0 && pp > 1) {
        if (py_mod(per_rank, vpp) != 0) return std::nullopt;
        build = py_div(per_rank, vpp);
      }
      const bool vp_first = vpp == 0 || v == 0, vp_last = vpp == 0 || v == vpp - 1;
      if (e && vp_first && r == 0 && --build < 0) return std::nullopt;
      if (l && vp_last && r == pp - 1 && --build < 0) return std::nullopt;
      int64_t offset = 0;  // get_transformer_layer_offset
      if (pp > 1 && (first || last)) {
        const int64_t middle_stages = pp - first - last, f0 = first ? fl : 0, l0 = last ? ll : 0;
        const int64_t middle = L - f0 - l0, middle_rank = first ? r - 1 : r;
        if (vpp != 0) {
          const int64_t cf = first ? py_div(fl, vpp) : 0, cl = last ? py_div(ll, vpp) : 0, cm = py_div(middle, vpp);
          const int64_t total = cf + cm + cl;
          if (r == 0) {
            offset = v * total;
          } else {
            if (middle_stages == 0) zero_division = true;
            offset = v * total + cf + middle_rank * (middle_stages == 0 ? 0 : py_div(cm, middle_stages));
          }
        } else {
          const int64_t per = middle_stages > 0 ? py_div(middle, middle_stages) : 0;
          offset = r == 0 ? 0 : middle_rank * per + f0;
        }
      } else if (pp > 1) {
        const int64_t n = L + e + l, per = py_div(n, pp);
        offset = vpp != 0 ? v * py_div(n, vpp) + r * py_div(per, vpp) : r * per;
        if (e && !(vp_first && r == 0)) offset -= 1;
      }
      out.emplace_back(offset, build);
    }
  return out;
}

// Whether the stages hold [0, L) once each, in order.
bool covers(const std::vector<std::pair<int64_t, int64_t>>& s, int64_t layers) {
  int64_t next = 0;
  for (const auto& [first, n] : s) {
    if (first != next || n < 0) return false;
    next += n;
  }
  return next == layers;
}

TEST(PipelineLayout, EveryLayerOnceInOrderAndAcceptedExactlyWhereMegatronBuildsEveryLayer) {
  int64_t accepted = 0, refused = 0, accepted_past_zero_division = 0;
  const std::vector<std::pair<int64_t, int64_t>> virtual_flags{{-1, -1}, {-1, 2}, {-1, 3}, {2, -1}};
  const std::vector<int64_t> ends{-1, 1, 2, 3, 5, 8};
  for (int64_t layers = 1; layers <= 12; layers++)
    for (int64_t pp = 1; pp <= 5; pp++)
      for (auto [lpvs, nvs] : virtual_flags)
        for (int64_t first : ends)
          for (int64_t last : ends)
            for (int accounted = 0; accounted < 4; accounted++) {
              if ((first != -1 || last != -1) && accounted != 0 && (layers + pp) % 5 != 0) continue;  // thinned
              PipelineFlags f = sweep_flags(layers, pp);
              f.num_layers_per_virtual_stage = lpvs;
              f.num_virtual_stages_per_rank = nvs;
              f.decoder_first_pipeline_num_layers = first;
              f.decoder_last_pipeline_num_layers = last;
              f.account_for_embedding = accounted & 1;
              f.account_for_loss = accounted & 2;
              bool zero_division = false;
              const auto want = megatron(f, zero_division);
              const bool megatron_builds = want.has_value() && covers(*want, layers);
              std::optional<PipelineLayout> got;
              try {
                got = train::plan_pipeline(f);
              } catch (const Error&) {
              }
              const std::string what = fmt::format("L {} pp {} lpvs {} nvs {} first {} last {} accounted {}", layers,
                                                   pp, lpvs, nvs, first, last, accounted);
              ASSERT_EQ(got.has_value(), megatron_builds) << what;
              if (!got) {
                refused++;
                continue;
              }
              accepted++;
              ASSERT_EQ(static_cast<int64_t>(got->stages.size()), pp * got->vpp) << what;
              std::vector<std::pair<int64_t, int64_t>> spans_in_order;
              for (const auto& s : got->stages) spans_in_order.emplace_back(s.first_layer, s.num_layers);
              ASSERT_EQ(spans_in_order, *want) << what;
              ASSERT_TRUE(covers(spans_in_order, layers)) << what;
              for (int64_t layer = 0; layer < layers; layer++) {
                const auto [r, v] = got->stage_of_layer(layer);
                const auto& s = got->at(r, v);
                ASSERT_TRUE(layer >= s.first_layer && layer < s.first_layer + s.num_layers) << what;
              }
              for (size_t i = 0; i < got->stages.size(); i++) {
                ASSERT_EQ(got->stages[i].embedding, i == 0) << what;
                ASSERT_EQ(got->stages[i].loss, i + 1 == got->stages.size()) << what;
              }
              // What each form promises: the first/last ranks' totals; otherwise equal chunks less the counted ends.
              int64_t first_total = 0, last_total = 0;
              for (int64_t v = 0; v < got->vpp; v++)
                first_total += got->at(0, v).num_layers, last_total += got->at(pp - 1, v).num_layers;
              if (pp > 1 && first != -1) {
                ASSERT_EQ(first_total, first) << what;
              }
              if (pp > 1 && last != -1) {
                ASSERT_EQ(last_total, last) << what;
              }
              if (first == -1 && last == -1) {
                const int64_t chunk = (layers + f.account_for_embedding + f.account_for_loss) / (pp * got->vpp);
                for (size_t i = 0; i < got->stages.size(); i++)
                  ASSERT_EQ(got->stages[i].num_layers, chunk - (i == 0 && f.account_for_embedding) -
                                                           (i + 1 == got->stages.size() && f.account_for_loss))
                      << what;
              }
              // Megatron's offset divides by zero there; the stages are the evident ones (HandComputed... above).
              accepted_past_zero_division += zero_division;
            }
  EXPECT_GT(accepted, 500);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted_past_zero_division, 0);
}

TEST(PipelineLayout, TheFlagsParseAndBadSplitsAreRefusedInTheFlagPass) {
  const auto run = testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 1, "1e-3");  // 2 layers
  auto c = train::parse_train_config(run + std::vector<std::string>{"--pipeline-model-parallel-layout", "Et,tL"});
  EXPECT_EQ(c.pipeline_model_parallel_layout, "Et,tL");
  EXPECT_EQ(train::plan_pipeline(train::pipeline_flags(c)).at(0, 0).num_layers, 2);
  c = train::parse_train_config(run + std::vector<std::string>{"--decoder-first-pipeline-num-layers", "2"});
  EXPECT_EQ(train::pipeline_flags(c).decoder_first_pipeline_num_layers, 2);
  auto refused = [&](std::vector<std::string> extra) {
    return testing::user_error_of([&] { train::parse_train_config(run + extra); });
  };
  EXPECT_TRUE(
      testing::contains(refused({"--pipeline-model-parallel-layout", "Et|tL"}),
                        "--pipeline-model-parallel-layout 'Et|tL' (2 stages) gives 2 virtual stages per pipeline rank "
                        "(the interleaved schedule), which need --pipeline-model-parallel-size > 1, got 1"));
  EXPECT_TRUE(testing::contains(refused({"--decoder-first-pipeline-num-layers", "1"}),
                                "leave 1 layers of --num-layers 2 for the 0 middle stage(s)"));
  EXPECT_TRUE(
      testing::contains(refused({"--decoder-last-pipeline-num-layers", "-3"}), "decoder-last-pipeline-num-layers"));
  EXPECT_TRUE(testing::contains(
      refused({"--num-layers-per-virtual-pipeline-stage", "1", "--num-virtual-stages-per-pipeline-rank", "2"}),
      "give at most one of"));
  // A layout that does not fit is refused by its own message before PP > 1 is looked at.
  EXPECT_TRUE(
      testing::contains(refused({"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|tL"}),
                        "the layout holds 4 decoder layers (t) but --num-layers is 2"));
  try {
    train::parse_flags({"--help"});
    ADD_FAILURE() << "no help";
  } catch (const train::HelpRequested& h) {
    for (const char* flag : {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                             "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                             "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                             "--pipeline-model-parallel-layout"})
      EXPECT_TRUE(testing::contains(h.text, flag)) << flag;
  }
}

}  // namespace
}  // namespace moecore
