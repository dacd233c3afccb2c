// plan_pipeline against Megatron: its docstrings' and unit tests' layouts and offsets (tests/unit_tests/transformer/
// test_transformer_layer.py, test_transformer_block.py, pipeline_parallel/test_pipeline_layout.py), hand-computed
// uneven splits, every refusal's message and the interleaved schedule's micro-batch rules. Over many combinations
// against a transcription of Megatron, and the flag pass: test_pipeline_layout_sweep.cpp.
#include <gtest/gtest.h>

#include <map>
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
using train::plan_pipeline;

PipelineFlags stage_flags(int64_t layers, int64_t pp) {
  PipelineFlags f;
  f.num_layers = layers;
  f.pp = pp;
  return f;
}

PipelineFlags layout_flags(int64_t layers, int64_t pp, const std::string& layout, int64_t mtp = 0) {
  PipelineFlags f = stage_flags(layers, pp);
  f.layout = layout;
  f.mtp_num_layers = mtp;
  return f;
}

std::string pipeline_refusal(const PipelineFlags& f) {
  return testing::user_error_of([&] { plan_pipeline(f); });
}

// (pp_rank, vstage) -> (first layer, layers)
std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> spans(const PipelineLayout& l) {
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> m;
  for (int64_t r = 0; r < l.pp; r++)
    for (int64_t v = 0; v < l.vpp; v++) m[{r, v}] = {l.at(r, v).first_layer, l.at(r, v).num_layers};
  return m;
}

TEST(PipelineLayout, LayoutStringExpandsAsMegatronsParser) {
  // parse_str_to_list's docstring: "Ettt|(tt|)*29,m|L" -> [E,t,t,t] + [t,t]*29 + [m], [L].
  std::vector<std::string> want{"Ettt"};
  for (int i = 0; i < 29; i++) want.emplace_back("tt");
  want.emplace_back("m");
  want.emplace_back("L");
  EXPECT_EQ(train::parse_pipeline_layout("Ettt|(tt|)*29,m|L"), want);
  // The docstring's unrolling examples, with layer characters: group repetition, then single-character repetition.
  EXPECT_EQ(train::parse_pipeline_layout("Et(t|tt|t)*2,tL"),
            (std::vector<std::string>{"Ett", "tt", "tt", "tt", "ttL"}));
  EXPECT_EQ(train::parse_pipeline_layout("(t)*3"), (std::vector<std::string>{"ttt"}));
  EXPECT_EQ(train::parse_pipeline_layout("Et,(t|)*2"), (std::vector<std::string>{"Ett", "t", ""}));
  EXPECT_EQ(train::parse_pipeline_layout("(|t)*2,tL"), (std::vector<std::string>{"", "t", "ttL"}));
  EXPECT_EQ(train::parse_pipeline_layout("Et*10|t*0L"), (std::vector<std::string>{"Etttttttttt", "L"}));
  EXPECT_EQ(train::parse_pipeline_layout("E|*2L"), (std::vector<std::string>{"E", "", "L"}));  // '|' repeats too
  // "(tt)*2*3": the group first (tttt*3), then the last t three times, as re.sub does in turn.
  EXPECT_EQ(train::parse_pipeline_layout("(tt)*2*3"), (std::vector<std::string>{"tttttt"}));
  EXPECT_EQ(train::parse_pipeline_layout(""), (std::vector<std::string>{""}));
  // No nesting (the group ends at the first ')'), unknown characters, spaces: the character is named.
  EXPECT_TRUE(testing::contains(testing::user_error_of([] { train::parse_pipeline_layout("((t)*2)*3"); }),
                                "invalid layer character '('"));
  const std::string bad = testing::user_error_of([] { train::parse_pipeline_layout("Et|x*2|L"); });
  EXPECT_TRUE(testing::contains(bad, "'Et|x*2|L': invalid layer character 'x' in stage 1 ('Et|xx|L' after expanding"))
      << bad;
  EXPECT_TRUE(testing::contains(bad, "E (embedding), t (transformer decoder layer), m (MTP layer), L (loss)")) << bad;
  EXPECT_TRUE(
      testing::contains(testing::user_error_of([] { train::parse_pipeline_layout("E t|L"); }), "character ' '"));
  EXPECT_TRUE(
      testing::contains(testing::user_error_of([] { train::parse_pipeline_layout("Et*99999999999999999999|L"); }),
                        "expands the layout beyond"));
  // Long strings in linear time and without deep recursion: a million characters of one stage, of unclosed '('.
  EXPECT_EQ(train::parse_pipeline_layout("E" + std::string(999998, 't') + "L")[0].size(), 1000000u);
  EXPECT_TRUE(testing::contains(testing::user_error_of([] { train::parse_pipeline_layout(std::string(1000000, '(')); }),
                                "invalid layer character '('"));
  EXPECT_TRUE(testing::contains(testing::user_error_of([] { train::parse_pipeline_layout(std::string(1048577, 't')); }),
                                "longer than 1048576 characters"));
  // "x*n" repeats any character but a newline (Python's '.'); digits after a match are all the count.
  EXPECT_TRUE(
      testing::contains(testing::user_error_of([] { train::parse_pipeline_layout("E\n*2L"); }), "character '\n'"));
  EXPECT_EQ(train::parse_pipeline_layout("Et*12L")[0].size(), 14u);
}

TEST(PipelineLayout, EvenSplitAndVirtualStagesAsMegatronsComments) {
  // get_num_layers_to_build's comment: 8 layers, 2 stages, 4 chunks: Stage 0: [0] [2] [4] [6], Stage 1: [1] [3] ...
  PipelineFlags f = stage_flags(8, 2);
  f.num_layers_per_virtual_stage = 1;
  PipelineLayout l = plan_pipeline(f);
  EXPECT_EQ(l.vpp, 4);
  for (int64_t v = 0; v < 4; v++) {
    EXPECT_EQ(l.at(0, v).first_layer, 2 * v);
    EXPECT_EQ(l.at(1, v).first_layer, 2 * v + 1);
    EXPECT_EQ(l.at(0, v).num_layers, 1);
  }
  f.num_layers_per_virtual_stage = 2;  // Stage 0: [0, 1] [4, 5], Stage 1: [2, 3] [6, 7]
  l = plan_pipeline(f);
  EXPECT_EQ(spans(l), (decltype(spans(l)){{{0, 0}, {0, 2}}, {{0, 1}, {4, 2}}, {{1, 0}, {2, 2}}, {{1, 1}, {6, 2}}}));
  EXPECT_EQ(l.stages.size(), 4u);
  EXPECT_EQ(l.stages[1].first_layer, 2);  // model-chunk order: index = vstage * pp + pp_rank
  EXPECT_TRUE(l.at(0, 0).embedding && !l.at(1, 0).embedding && l.at(1, 1).loss && !l.at(0, 1).loss);
  EXPECT_EQ(l.stage_of_layer(5), (std::pair<int64_t, int64_t>{0, 1}));
  // --num-virtual-stages-per-pipeline-rank 2 gives the same; one virtual stage is no interleaving.
  f.num_layers_per_virtual_stage = -1;
  f.num_virtual_stages_per_rank = 2;
  EXPECT_EQ(spans(plan_pipeline(f)), spans(l));
  f.num_virtual_stages_per_rank = 1;
  EXPECT_FALSE(plan_pipeline(f).interleaved());
  // One stage: everything.
  l = plan_pipeline(stage_flags(5, 1));
  ASSERT_EQ(l.stages.size(), 1u);
  EXPECT_TRUE(l.stages[0].embedding && l.stages[0].loss && l.stages[0].num_layers == 5);
}

// test_transformer_layer.py's test_get_layer_offset_parametrized, all four cases, and the layer counts.
TEST(PipelineLayout, MegatronsUnevenVirtualOffsets) {
  struct Case {
    int64_t layers, first, last;
    std::map<std::pair<int64_t, int64_t>, int64_t> offsets;
  };
  const std::vector<Case> cases{
      {30,
       8,
       10,
       {{{0, 0}, 0}, {{0, 1}, 15}, {{1, 0}, 4}, {{1, 1}, 19}, {{2, 0}, 7}, {{2, 1}, 22}, {{3, 0}, 10}, {{3, 1}, 25}}},
      {26,
       8,
       -1,
       {{{0, 0}, 0}, {{0, 1}, 13}, {{1, 0}, 4}, {{1, 1}, 17}, {{2, 0}, 7}, {{2, 1}, 20}, {{3, 0}, 10}, {{3, 1}, 23}}},
      {26,
       -1,
       8,
       {{{0, 0}, 0}, {{0, 1}, 13}, {{1, 0}, 3}, {{1, 1}, 16}, {{2, 0}, 6}, {{2, 1}, 19}, {{3, 0}, 9}, {{3, 1}, 22}}},
      {24,
       -1,
       -1,
       {{{0, 0}, 0}, {{0, 1}, 12}, {{1, 0}, 3}, {{1, 1}, 15}, {{2, 0}, 6}, {{2, 1}, 18}, {{3, 0}, 9}, {{3, 1}, 21}}}};
  for (const auto& c : cases) {
    PipelineFlags f = stage_flags(c.layers, 4);
    f.num_virtual_stages_per_rank = 2;
    f.decoder_first_pipeline_num_layers = c.first;
    f.decoder_last_pipeline_num_layers = c.last;
    const PipelineLayout l = plan_pipeline(f);
    for (const auto& [stage, offset] : c.offsets)
      EXPECT_EQ(l.at(stage.first, stage.second).first_layer, offset) << c.layers << " " << stage.first;
    EXPECT_EQ(l.num_layers(), c.layers);
  }
  // Case 1's comments: stage 0 holds 4 + 4, stage 3 holds 5 + 5 (8 and 10 over two virtual stages).
  PipelineFlags f = stage_flags(30, 4);
  f.num_virtual_stages_per_rank = 2;
  f.decoder_first_pipeline_num_layers = 8;
  f.decoder_last_pipeline_num_layers = 10;
  const PipelineLayout l = plan_pipeline(f);
  EXPECT_EQ(l.at(0, 1).num_layers, 4);
  EXPECT_EQ(l.at(1, 0).num_layers, 3);
  EXPECT_EQ(l.at(3, 1).num_layers, 5);
  const std::string d = l.describe();
  EXPECT_TRUE(testing::contains(d, "pipeline: 30 decoder layers over 4 stage(s) x 2 virtual stages (interleaved)"))
      << d;
  EXPECT_TRUE(testing::contains(d, "PP rank 0    embedding, decoder 0-3")) << d;
  EXPECT_TRUE(testing::contains(d, "decoder 25-29, loss")) << d;
}

// test_transformer_block.py's TestPipelineParallelTransformerBlock.test_layer_builder: every case, accepted or not,
// and the accepted ones build num_layers layers.
TEST(PipelineLayout, MegatronsLayerBuilderCases) {
  struct Case {
    int64_t layers, pp, vpp;
    bool e, l;
    int64_t first, last;
    bool error;
  };
  const std::vector<Case> cases{{60, 5, -1, false, false, -1, 4, false},  {60, 8, -1, false, false, 6, 6, false},
                                {64, 4, -1, false, false, -1, -1, false}, {64, 4, 8, false, false, -1, -1, false},
                                {60, 6, -1, false, false, 5, -1, false},  {101, 8, -1, false, false, 13, 13, true},
                                {63, 4, -1, true, false, -1, -1, false},  {63, 4, -1, false, true, -1, -1, false},
                                {62, 4, -1, true, true, -1, -1, false},   {62, 4, 2, true, true, -1, -1, false},
                                {65, 4, -1, false, false, -1, -1, true},  {65, 4, -1, true, true, -1, -1, true},
                                {61, 4, -1, false, false, 12, -1, true},  {2, 4, -1, false, false, -1, -1, true},
                                {60, 6, -1, true, false, 5, 5, true},     {50, 2, 7, false, false, -1, -1, true},
                                {4, 4, 4, false, false, -1, -1, true}};
  for (const auto& c : cases) {
    PipelineFlags f = stage_flags(c.layers, c.pp);
    f.num_virtual_stages_per_rank = c.vpp;
    f.account_for_embedding = c.e;
    f.account_for_loss = c.l;
    f.decoder_first_pipeline_num_layers = c.first;
    f.decoder_last_pipeline_num_layers = c.last;
    const std::string err = testing::error_of([&] { plan_pipeline(f); });
    EXPECT_EQ(!err.empty(), c.error) << c.layers << " pp " << c.pp << ": " << err;
    if (!c.error) {
      EXPECT_EQ(plan_pipeline(f).num_layers(), c.layers);
    }
  }
}

TEST(PipelineLayout, HandComputedUnevenAndAccountedSplits) {
  PipelineFlags f = stage_flags(30, 4);  // 8 | 6 | 6 | 10
  f.decoder_first_pipeline_num_layers = 8;
  f.decoder_last_pipeline_num_layers = 10;
  EXPECT_EQ(spans(plan_pipeline(f)), (decltype(spans(plan_pipeline(f))){
                                         {{0, 0}, {0, 8}}, {{1, 0}, {8, 6}}, {{2, 0}, {14, 6}}, {{3, 0}, {20, 10}}}));
  f = stage_flags(60, 5);  // last 4: 14 | 14 | 14 | 14 | 4
  f.decoder_last_pipeline_num_layers = 4;
  auto s = spans(plan_pipeline(f));
  EXPECT_EQ((s[{3, 0}]), (std::pair<int64_t, int64_t>{42, 14}));
  EXPECT_EQ((s[{4, 0}]), (std::pair<int64_t, int64_t>{56, 4}));
  f = stage_flags(7, 2);  // PP 2, both ends set: no middle stage
  f.decoder_first_pipeline_num_layers = 3;
  f.decoder_last_pipeline_num_layers = 4;
  s = spans(plan_pipeline(f));
  EXPECT_EQ((s[{1, 0}]), (std::pair<int64_t, int64_t>{3, 4}));
  // PP 2 x VPP 2 with both ends set: Megatron's offset divides by zero middle stages; the layers are well defined.
  f = stage_flags(8, 2);
  f.num_virtual_stages_per_rank = 2;
  f.decoder_first_pipeline_num_layers = 2;
  f.decoder_last_pipeline_num_layers = 6;
  s = spans(plan_pipeline(f));
  EXPECT_EQ((s[{0, 0}]), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ((s[{1, 0}]), (std::pair<int64_t, int64_t>{1, 3}));
  EXPECT_EQ((s[{0, 1}]), (std::pair<int64_t, int64_t>{4, 1}));
  EXPECT_EQ((s[{1, 1}]), (std::pair<int64_t, int64_t>{5, 3}));
  // The embedding counted as a layer: 63 + 1 over 4 stages of 16, the first holding 15 decoder layers.
  f = stage_flags(63, 4);
  f.account_for_embedding = true;
  s = spans(plan_pipeline(f));
  EXPECT_EQ((s[{0, 0}]), (std::pair<int64_t, int64_t>{0, 15}));
  EXPECT_EQ((s[{1, 0}]), (std::pair<int64_t, int64_t>{15, 16}));
  EXPECT_EQ((s[{3, 0}]), (std::pair<int64_t, int64_t>{47, 16}));
  // Both counted, two virtual stages: 62 + 2 over 8 chunks of 8; the first and the last chunk hold 7.
  f = stage_flags(62, 4);
  f.account_for_embedding = f.account_for_loss = true;
  f.num_virtual_stages_per_rank = 2;
  s = spans(plan_pipeline(f));
  EXPECT_EQ((s[{0, 0}]), (std::pair<int64_t, int64_t>{0, 7}));
  EXPECT_EQ((s[{1, 0}]), (std::pair<int64_t, int64_t>{7, 8}));
  EXPECT_EQ((s[{0, 1}]), (std::pair<int64_t, int64_t>{31, 8}));
  EXPECT_EQ((s[{3, 1}]), (std::pair<int64_t, int64_t>{55, 7}));
  // --num-layers-per-virtual-pipeline-stage counts the embedding and the loss too: (6 + 2) / 2 = 4 = 2 x 2.
  f = stage_flags(6, 2);
  f.account_for_embedding = f.account_for_loss = true;
  f.num_layers_per_virtual_stage = 2;
  const PipelineLayout l = plan_pipeline(f);
  EXPECT_EQ(l.vpp, 2);
  EXPECT_EQ(l.at(0, 0).num_layers, 1);
  EXPECT_EQ(l.at(1, 1).num_layers, 1);
  EXPECT_EQ(l.at(1, 1).first_layer, 5);
}

// test_transformer_block.py's TestPipelineParallelLayoutTransformerBlock (its lists written as strings), and
// test_pipeline_layout.py's layouts with an MTP layer.
TEST(PipelineLayout, MegatronsLayoutCases) {
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(7, 2, "t*6|tL")),
                                "first layer of the layout must be the embedding"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(7, 2, "Et*6|t")),
                                "last layer of the layout must be the loss (L)"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(7, 2, "E|x*7L")), "invalid layer character 'x'"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(7, 2, "E|t*7|L")), "has 3 stages, not a multiple of"));
  EXPECT_EQ(plan_pipeline(layout_flags(7, 2, "Et|t*4|t|tL")).vpp, 2);
  EXPECT_EQ(plan_pipeline(layout_flags(6, 2, "Et|(tt|)*2,tL")).num_stages(), 4);    // --help's example
  EXPECT_EQ(plan_pipeline(layout_flags(7, 2, "E|t*7||L")).at(1, 1).num_layers, 0);  // an empty stage
  EXPECT_EQ(plan_pipeline(layout_flags(7, 2, "E|t*6|t|L")).at(0, 1).first_layer, 6);
  // test_layout_layer_number's golden layer numbers (1-based there): [[[], []], [[1], [5]], [[2, 3], [6]], [[4],
  // [7, 8]]].
  const PipelineLayout l = plan_pipeline(layout_flags(8, 4, "E|t|tt|t||t|t|ttL"));
  EXPECT_EQ(spans(l), (decltype(spans(l)){{{0, 0}, {0, 0}},
                                          {{0, 1}, {4, 0}},
                                          {{1, 0}, {0, 1}},
                                          {{1, 1}, {4, 1}},
                                          {{2, 0}, {1, 2}},
                                          {{2, 1}, {5, 1}},
                                          {{3, 0}, {3, 1}},
                                          {{3, 1}, {6, 2}}}));
  EXPECT_TRUE(l.at(0, 0).embedding && l.at(3, 1).loss);
  // MTP in the last stage, in the second last with a decoder layer, alone in the second last.
  EXPECT_EQ(plan_pipeline(layout_flags(8, 4, "E|t*3|(t|)*5mL", 1)).at(3, 1).mtp_layers, 1);
  EXPECT_EQ(plan_pipeline(layout_flags(8, 4, "E|t*3|(t|)*4tm|L", 1)).at(2, 1).mtp_layers, 1);
  const PipelineLayout m = plan_pipeline(layout_flags(8, 4, "E|t*3|(t|)*3tt|m|L", 1));
  EXPECT_EQ(m.at(2, 1).mtp_layers, 1);
  EXPECT_EQ(m.at(2, 1).num_layers, 0);
  EXPECT_EQ(m.at(1, 1).first_layer, 6);
  // TransformerConfig's docstring: 'E|(tt|)*2,(t|)*4,mL' (PP 4, VPP 2): rank 0 the embedding, ranks 1-2 two layers,
  // rank 3 one, then one each, MTP and loss on the last.
  const PipelineLayout d = plan_pipeline(layout_flags(8, 4, "E|(tt|)*2,(t|)*4,mL", 1));
  EXPECT_EQ(d.at(0, 0).num_layers, 0);
  EXPECT_EQ(d.at(2, 0).num_layers, 2);
  EXPECT_EQ(d.at(3, 0).num_layers, 1);
  EXPECT_EQ(d.at(0, 1).first_layer, 5);
  EXPECT_TRUE(d.at(3, 1).loss && d.at(3, 1).mtp_layers == 1 && d.at(3, 1).num_layers == 0);
  // DeepSeek-V3's: 61 layers on PP 16 x VPP 2 with the MTP layer on rank 14's second virtual stage.
  const PipelineLayout v3 = plan_pipeline(layout_flags(61, 16, "Et*3|(tt|)*29,m|L", 1));
  EXPECT_EQ(v3.vpp, 2);
  EXPECT_EQ(v3.at(0, 0).num_layers, 3);
  EXPECT_EQ(v3.at(13, 1).first_layer, 59);
  EXPECT_EQ(v3.at(14, 1).mtp_layers, 1);
  EXPECT_TRUE(v3.at(15, 1).loss && v3.at(15, 1).num_layers == 0);
}

TEST(PipelineLayout, LayoutRefusalsShowTheParsedLayout) {
  const std::string e = pipeline_refusal(layout_flags(9, 2, "Et*3|t*4L"));
  EXPECT_TRUE(
      testing::contains(e, "the layout holds 7 decoder layers (t) but --num-layers is 9: give it exactly 9 t's"))
      << e;
  EXPECT_TRUE(
      testing::contains(e, "--pipeline-model-parallel-layout 'Et*3|t*4L' parsed for --pipeline-model-parallel-size 2"))
      << e;
  EXPECT_TRUE(testing::contains(e, "PP rank 0    embedding,decoder*3\n  PP rank 1    decoder*4,loss")) << e;
  const std::string v = pipeline_refusal(layout_flags(6, 2, "Et|tt|t|tL"));
  EXPECT_TRUE(testing::contains(v, "VPP rank 0") && testing::contains(v, "VPP rank 1")) << v;
  EXPECT_TRUE(
      testing::contains(pipeline_refusal(layout_flags(2, 2, "EEt|tL")), "the embedding (E) exactly once, not 2 times"));
  EXPECT_TRUE(
      testing::contains(pipeline_refusal(layout_flags(2, 2, "Et|LtL")), "the loss (L) exactly once, not 2 times"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(2, 2, "Et|mtL")),
                                "but --mtp-num-layers is 0 (leave m out, or set --mtp-num-layers to the m's)"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(2, 2, "Et|mtL", 1)),
                                "decoder layers (t) must all come before the MTP"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(4, 2, "Ettt|tm||L", 1)),
                                "PP rank 1 holds them in virtual stage 0 of 2"));
  // The flag's own help example cannot fit any model: its two MTP layers sit in two stages.
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(3, 4, "E|(t|)*3,m|m||L", 2)),
                                "all 2 MTP layers (m) must be in one stage, but PP rank 0 virtual stage 1 holds 1"));
  EXPECT_TRUE(testing::contains(pipeline_refusal(layout_flags(2, 2, "|")),
                                "first layer of the layout must be the embedding (E), but "
                                "it is nothing"));
  // Megatron's embedding and loss go on the pipeline's first and last stages; empty stages may come before E.
  const PipelineLayout l = plan_pipeline(layout_flags(2, 3, "|Et|tL"));
  EXPECT_TRUE(l.at(0, 0).embedding && !l.at(1, 0).embedding && l.at(1, 0).first_layer == 0);
  EXPECT_EQ(l.describe(),
            "pipeline: 2 decoder layers over 3 stage(s)\n  PP rank 0    embedding\n  PP rank 1    "
            "decoder 0\n  PP rank 2    decoder 1, loss\n");
}

TEST(PipelineLayout, EveryArgumentCheckNamesTheFlagsAndAFix) {
  auto with = [](PipelineFlags f, auto set) {
    set(f);
    return pipeline_refusal(f);
  };
  std::string e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.num_layers_per_virtual_stage = 2;
    f.layout = "Et*4|t*4L";
  });
  EXPECT_TRUE(testing::contains(e,
                                "give at most one of --num-layers-per-virtual-pipeline-stage (2), "
                                "--num-virtual-stages-per-pipeline-rank (-1) and --pipeline-model-parallel-layout"))
      << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.num_layers_per_virtual_stage = 2;
    f.decoder_first_pipeline_num_layers = 2;
  });
  EXPECT_TRUE(testing::contains(e, "use --num-virtual-stages-per-pipeline-rank to give the virtual stages")) << e;
  e = with(stage_flags(9, 2), [](PipelineFlags& f) { f.num_layers_per_virtual_stage = 2; });
  EXPECT_TRUE(
      testing::contains(e,
                        "--num-layers 9 is not divisible by --pipeline-model-parallel-size 2: use --num-layers 8 or "
                        "10"))
      << e;
  e = with(stage_flags(12, 2), [](PipelineFlags& f) { f.num_layers_per_virtual_stage = 4; });
  EXPECT_TRUE(testing::contains(e,
                                "each pipeline stage holds 6 layers (--num-layers 12 / 2 stages), not divisible by "
                                "--num-layers-per-virtual-pipeline-stage 4: use 1, 2, 3 or 6"))
      << e;
  e = pipeline_refusal(stage_flags(65, 4));
  EXPECT_TRUE(
      testing::contains(e,
                        "--num-layers 65 is not divisible by --pipeline-model-parallel-size 4: each stage holds an "
                        "equal share; use --num-layers 64 or 68, or size the first or last stage"))
      << e;
  e = with(stage_flags(65, 4), [](PipelineFlags& f) { f.account_for_embedding = f.account_for_loss = true; });
  EXPECT_TRUE(testing::contains(e,
                                "--num-layers 65 + 1 (--account-for-embedding-in-pipeline-split) + 1 "
                                "(--account-for-loss-in-pipeline-split) = 67 (the embedding and the loss each counted"))
      << e;
  e = with(stage_flags(4, 1), [](PipelineFlags& f) { f.num_virtual_stages_per_rank = 2; });
  EXPECT_TRUE(
      testing::contains(e,
                        "--num-virtual-stages-per-pipeline-rank 2 gives 2 virtual stages per pipeline rank (the "
                        "interleaved schedule), which need --pipeline-model-parallel-size > 1, got 1"))
      << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.num_virtual_stages_per_rank = 2;
    f.overlap_p2p_comm = false;
  });
  EXPECT_TRUE(testing::contains(e, "> 2, got 2 (with --no-overlap-p2p-communication")) << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.decoder_first_pipeline_num_layers = 4;
    f.account_for_loss = true;
  });
  EXPECT_TRUE(testing::contains(e,
                                "--decoder-first-pipeline-num-layers 4 and --account-for-loss-in-pipeline-split are "
                                "exclusive (as in Megatron)"))
      << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.layout = "Et*4|t*4L";
    f.account_for_embedding = true;
  });
  EXPECT_TRUE(testing::contains(e, "--pipeline-model-parallel-layout lays out every stage: leave out")) << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) { f.decoder_first_pipeline_num_layers = -2; });
  EXPECT_TRUE(testing::contains(e, "--decoder-first-pipeline-num-layers -2 must be larger than 0 (-1: unset")) << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) { f.num_virtual_stages_per_rank = 0; });
  EXPECT_TRUE(testing::contains(e, "--num-virtual-stages-per-pipeline-rank 0 must be larger than 0")) << e;
  e = with(stage_flags(8, 4), [](PipelineFlags& f) {
    f.num_virtual_stages_per_rank = 2;
    f.decoder_first_pipeline_num_layers = 3;
  });
  EXPECT_TRUE(testing::contains(e,
                                "--decoder-first-pipeline-num-layers 3 must be divisible by the 2 virtual stages per "
                                "pipeline rank of --num-virtual-stages-per-pipeline-rank 2"))
      << e;
  e = with(stage_flags(30, 4), [](PipelineFlags& f) {
    f.num_virtual_stages_per_rank = 2;
    f.decoder_last_pipeline_num_layers = 5;
  });
  EXPECT_TRUE(testing::contains(e, "--decoder-last-pipeline-num-layers 5 must be divisible by the 2 virtual stages"))
      << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.decoder_first_pipeline_num_layers = 3;
    f.decoder_last_pipeline_num_layers = 4;
  });
  EXPECT_TRUE(
      testing::contains(e,
                        "--decoder-first-pipeline-num-layers 3 and --decoder-last-pipeline-num-layers 4 leave 1 "
                        "layers of --num-layers 8 for the 0 middle stage(s) of --pipeline-model-parallel-size 2: with "
                        "no middle stage the first and last stages must hold every layer (for example "
                        "--decoder-first-pipeline-num-layers 4)"))
      << e;
  e = with(stage_flags(8, 3), [](PipelineFlags& f) {
    f.decoder_first_pipeline_num_layers = 4;
    f.decoder_last_pipeline_num_layers = 4;
  });
  EXPECT_TRUE(testing::contains(e, "leave 0 layers of --num-layers 8 for the 1 middle stage(s)")) << e;
  EXPECT_TRUE(
      testing::contains(e, "every middle stage needs layers (for example --decoder-first-pipeline-num-layers 3)"))
      << e;
  e = with(stage_flags(4, 3), [](PipelineFlags& f) {
    f.decoder_first_pipeline_num_layers = 4;
    f.decoder_last_pipeline_num_layers = 1;
  });
  EXPECT_TRUE(
      testing::contains(e,
                        "--decoder-first-pipeline-num-layers 4 and --decoder-last-pipeline-num-layers 1 hold more "
                        "than --num-layers 4 (for example --decoder-first-pipeline-num-layers 2)"))
      << e;
  e = with(stage_flags(61, 4), [](PipelineFlags& f) { f.decoder_first_pipeline_num_layers = 12; });
  EXPECT_TRUE(
      testing::contains(e,
                        "the 49 layers --decoder-first-pipeline-num-layers 12 leave of --num-layers 61 do not "
                        "split evenly over the 3 middle stage(s) of --pipeline-model-parallel-size 4: they must be a "
                        "multiple of 3 (for example --decoder-first-pipeline-num-layers 13)"))
      << e;
  e = with(stage_flags(11, 4), [](PipelineFlags& f) {
    f.num_virtual_stages_per_rank = 2;
    f.decoder_first_pipeline_num_layers = 2;
  });
  EXPECT_TRUE(
      testing::contains(e,
                        "each middle pipeline rank holds 3 layers (--decoder-first-pipeline-num-layers 2 leave 9 for "
                        "3), which do not split into the 2 virtual stages of --num-virtual-stages-per-pipeline-rank 2: "
                        "the layers left for the middle stages must be a multiple of 3 x 2"))
      << e;
  e = with(stage_flags(4, 4), [](PipelineFlags& f) { f.num_virtual_stages_per_rank = 4; });
  EXPECT_TRUE(
      testing::contains(e,
                        "PP rank 0 holds 1 decoder layers, which do not split into the 4 virtual stages of "
                        "--num-virtual-stages-per-pipeline-rank 4 (equal shares, as Megatron requires): use 1 virtual "
                        "stages, or --num-layers a multiple of 4 x 4"))
      << e;
  e = with(stage_flags(9, 2), [](PipelineFlags& f) {
    f.num_virtual_stages_per_rank = 2;
    f.account_for_embedding = true;
  });
  EXPECT_TRUE(
      testing::contains(e,
                        "each pipeline rank holds 5 layers (--num-layers 9 + 1 (--account-for-embedding-in-pipeline-"
                        "split) = 10 (the embedding counted as a layer) / 2), which do not split into the 2 virtual "
                        "stages of --num-virtual-stages-per-pipeline-rank 2: use 1 or 5 virtual stages per rank"))
      << e;
  // Absurd sizes are refused, not allocated or overflowed.
  e = pipeline_refusal(stage_flags(2147483647, 2147483647));
  EXPECT_TRUE(testing::contains(e, "beyond the 1048576 pipeline stages moecore plans for")) << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) {
    f.decoder_first_pipeline_num_layers = 9223372036854775807;
    f.decoder_last_pipeline_num_layers = 9223372036854775807;
  });
  EXPECT_TRUE(testing::contains(e, "hold more than --num-layers 8")) << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) { f.decoder_first_pipeline_num_layers = 9223372036854775807; });
  EXPECT_TRUE(
      testing::contains(e, "--decoder-first-pipeline-num-layers 9223372036854775807 hold more than --num-layers 8"))
      << e;
  e = with(stage_flags(8, 2), [](PipelineFlags& f) { f.num_virtual_stages_per_rank = 9223372036854775807; });
  EXPECT_TRUE(testing::contains(e, "--num-virtual-stages-per-pipeline-rank 9223372036854775807 (equal shares")) << e;
  // PP 1 with both ends set: Megatron builds the last's count; accepted only where that is every layer.
  e = with(stage_flags(4, 1), [](PipelineFlags& f) {
    f.decoder_first_pipeline_num_layers = 1;
    f.decoder_last_pipeline_num_layers = 2;
  });
  EXPECT_TRUE(testing::contains(e, "--pipeline-model-parallel-size 1 has one stage, both the first and the last")) << e;
  PipelineFlags ok = stage_flags(4, 1);
  ok.decoder_first_pipeline_num_layers = 1;
  ok.decoder_last_pipeline_num_layers = 4;
  EXPECT_EQ(plan_pipeline(ok).at(0, 0).num_layers, 4);
  ok.decoder_last_pipeline_num_layers = -1;
  EXPECT_TRUE(testing::contains(pipeline_refusal(ok), "leave 3 layers of --num-layers 4 for the 0 middle stage(s)"));
  ok.decoder_first_pipeline_num_layers = 4;
  EXPECT_EQ(plan_pipeline(ok).num_layers(), 4);
}

TEST(PipelineLayout, InterleavedScheduleMicroBatchRules) {
  PipelineFlags f = stage_flags(8, 4);
  const PipelineLayout plain = plan_pipeline(f);
  for (int64_t m : {1, 3, 5}) train::check_pipeline_microbatches(plain, m);  // 1F1B: any count
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] { train::check_pipeline_microbatches(plain, 0); }),
                                "at least one micro-batch"));
  f.num_virtual_stages_per_rank = 2;
  const PipelineLayout l = plan_pipeline(f);
  train::check_pipeline_microbatches(l, 4);
  train::check_pipeline_microbatches(l, 12);
  for (int64_t m : {2, 6, 9}) {
    const std::string e = testing::user_error_of([&] { train::check_pipeline_microbatches(l, m); });
    EXPECT_TRUE(
        testing::contains(e, fmt::format("the interleaved schedule (2 virtual stages per pipeline rank) runs {} "
                                         "micro-batch(es) per step",
                                         m)))
        << e;
    EXPECT_TRUE(testing::contains(e, "which must be a multiple of --pipeline-model-parallel-size 4")) << e;
  }
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] { train::check_pipeline_microbatches(l, 6); }),
                                "use 4 or 8 micro-batches"));
  // A group size (Megatron's microbatch_group_size_per_vp_stage): its docstring's PP 2, group 3, 5 micro-batches.
  f = stage_flags(8, 2);
  f.num_virtual_stages_per_rank = 2;
  const PipelineLayout g = plan_pipeline(f);
  train::check_pipeline_microbatches(g, 5, 3);
  train::check_pipeline_microbatches(g, 6, 3);
  EXPECT_TRUE(
      testing::contains(testing::user_error_of([&] { train::check_pipeline_microbatches(g, 4, 3); }),
                        "the last group of micro-batches, 1 of them (4 modulo the group size 3), must be empty or at "
                        "least --pipeline-model-parallel-size 2"));
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] { train::check_pipeline_microbatches(g, 2, 3); }),
                                "must lie in [PP 2, micro-batches 2]"));
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] { train::check_pipeline_microbatches(g, 4, 1); }),
                                "must lie in [PP 2, micro-batches 4]"));
}

}  // namespace
}  // namespace moecore
