// Megatron's logging flags: --log-throughput's FLOP count (Megatron's num_floating_point_operations against a hand
// count and against moecore's step_flops), the log line's and metrics file's throughput, params norm, num zeros
// and per-layer MoE losses (their mean over the MoE layers is the logged total), --logging-level on warnings, and
// the refusals (--log-progress; num zeros under the distributed optimizer).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config_util.h"
#include "moecore/core/file.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/train/observe/cost_model.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

// Two layers (MoE then dense: --moe-layer-freq 2), H 8, 2 query heads and 1 key/value group of dimension 4, SwiGLU,
// dense FFN 16, experts of 6 top-2, a shared expert of 4, S 4, global batch 2, padded vocabulary 32. By hand:
//   tokens 8, Σ S² = 32; q = 8, kv = 4.
//   attention (token-linear): 6·(H·(q + 2kv) + q·H) = 6·(128 + 64) = 1152 per layer, 2304 for both;
//   core attention: 6·q = 48 per layer, 96 for both, times Σ S² = 3072;
//   FFNs: 6·H·(16·3·1 dense + 6·2·3·1 routed + 4·3·1 shared) = 48·96 = 4608; logits: 6·H·32 = 1536.
//   total = 8·(4608 + 2304 + 1536) + 3072 = 70656.
TEST(LoggingFlops, MegatronFormulaMatchesHandCountAndStepFlops) {
  train::TrainConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.group_query_attention = true;
  c.num_query_groups = 1;
  c.kv_channels = 4;
  c.swiglu = true;
  c.ffn_hidden_size = 16;
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 6;
  c.moe_router_topk = 2;
  c.moe_shared_expert_intermediate_size = 4;
  c.is_moe_layer = {true, false};  // --moe-layer-freq 2, as resolve parses it
  c.seq_length = 4;
  c.global_batch_size = 2;
  EXPECT_EQ(train::num_floating_point_operations(c, 32), 70656.0);
  EXPECT_EQ(train::step_flops(c, 32), 70656.0);
  // GeLU instead of SwiGLU: two matrices per FFN, the FFN term 48·(32 + 24 + 8) = 3072.
  c.swiglu = false;
  EXPECT_EQ(train::num_floating_point_operations(c, 32), 8.0 * (3072 + 2304 + 1536) + 3072);
  EXPECT_EQ(train::step_flops(c, 32), train::num_floating_point_operations(c, 32));
  // Dense model: every layer's FFN is the dense one.
  c.num_experts = 0, c.is_moe_layer = {false, false};
  EXPECT_EQ(train::num_floating_point_operations(c, 32), 8.0 * (6 * 8 * 16 * 2 * 2 + 2304 + 1536) + 3072);
  EXPECT_EQ(train::step_flops(c, 32), train::num_floating_point_operations(c, 32));
}

// MLA and MTP (Megatron's MLA branch and its MTP terms), by hand: H 8, 2 heads, q_lora 4, kv_lora 2, qk 3 + rope 2,
// v 3, 2 layers (both dense FFN 16, SwiGLU), one MTP depth, S 4, global batch 2, padded vocabulary 32.
//   per layer per token: q 4·(8 + 2·5 + 1) = 76; kv 2·(8 + 2·6 + 1) + 8·2 = 58; o 2·3·8 = 48;
//   core 4·2·5/2 + 4·2·3/2 = 32; ×6 = 1284; 3 layers with the MTP one: 3852.
//   FFNs: 6·8·16·3 = 2304 per layer, 6912 for 3; MTP norms and eh_proj: 6·(24 + 128) = 912; logits 2·6·8·32 = 3072.
//   total = 8·(3852 + 6912 + 912 + 3072) = 117984.
TEST(LoggingFlops, MultiLatentAttentionAndMtpAsMegatronCounts) {
  train::TrainConfig c;
  c.num_layers = 2, c.hidden_size = 8, c.num_attention_heads = 2, c.swiglu = true, c.ffn_hidden_size = 16;
  c.multi_latent_attention = true, c.q_lora_rank = 4, c.kv_lora_rank = 2, c.qk_head_dim = 3;
  c.qk_pos_emb_head_dim = 2, c.v_head_dim = 3, c.mtp_num_layers = 1, c.seq_length = 4, c.global_batch_size = 2;
  c.is_moe_layer = {false, false};
  EXPECT_EQ(train::num_floating_point_operations(c, 32), 117984.0);
  EXPECT_DOUBLE_EQ(train::step_flops(c, 32), train::num_floating_point_operations(c, 32));
  // The DeepSeek-V3 preset (MoE layers, a shared expert, the MTP depth MoE like the last layer): the two agree.
  const train::TrainConfig d =
      testing::small_config(testing::mock_run_flags(64, 2, 8, 1000, 1, "1e-3"), {"--model", "deepseek-v3"});
  EXPECT_NEAR(train::step_flops(d, 1024), train::num_floating_point_operations(d, 1024),
              1e-12 * train::step_flops(d, 1024));
}

TEST(LoggingFlops, AgreeOnResolvedPresetSizedConfigs) {
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {},
           {"--moe-layer-freq", "([0]*1+[1]*1)", "--moe-shared-expert-intermediate-size", "48"},
           {"--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16"}}) {
    const train::TrainConfig c =
        testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(64, 2, 8, 1000, 1, "1e-3"), extra);
    const double a = train::step_flops(c, 1024), b = train::num_floating_point_operations(c, 1024);
    EXPECT_NEAR(a, b, 1e-12 * b);
  }
}

struct Logged {
  std::string console;
  std::vector<nlohmann::json> lines;
  double params_norm = 0;  // of the parameters after the run, computed here
  int64_t zeros = 0;       // of the gradients after the run
};

Logged run_logged(const std::vector<std::string>& extra, int64_t iters = 3) {
  const std::string out_path = testing::fresh_temp_path("logging_out"), metrics = out_path + ".jsonl";
  const train::TrainConfig c =
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, iters, "1e-3"),
                            std::vector<std::string>{"--log-interval", "1", "--metrics-file", metrics} + extra);
  Logged l;
  {
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    train::Trainer t(c, out, false);
    t.run();
    double sq = 0;
    for (const auto& p : t.params().all()) {
      sq += kernels::sum_squares(p->value);
      for (int64_t i = 0; i < p->grad.numel(); i++) l.zeros += p->grad.item(i) == 0.0;
    }
    l.params_norm = std::sqrt(sq);
    std::fclose(out);
  }
  l.console = read_file(out_path, "the training log");
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) l.lines.push_back(nlohmann::json::parse(line));
  return l;
}

TEST(LoggingLine, ThroughputParamsNormNumZerosInLineAndMetricsFile) {
  // Untied: the embedding rows of the padded vocabulary get no gradient (tied, the output layer gives them one).
  const Logged l = run_logged(
      {"--log-throughput", "--log-params-norm", "--log-num-zeros-in-grad", "--untie-embeddings-and-output-weights"});
  EXPECT_NE(l.console.find("| throughput per GPU (TFLOP/s/GPU): "), std::string::npos) << l.console;
  EXPECT_NE(l.console.find("| num zeros: "), std::string::npos) << l.console;
  EXPECT_NE(l.console.find("| params norm: "), std::string::npos) << l.console;
  ASSERT_EQ(l.lines.size(), 3u);
  for (const auto& j : l.lines) {
    // One rank: TFLOP/s per GPU is the line's GFLOP/s over 1000.
    EXPECT_NEAR(j.at("throughput_tflops_per_gpu").get<double>() * 1000, j.at("gflops").get<double>(),
                1e-9 * j.at("gflops").get<double>());
    EXPECT_GT(j.at("params_norm").get<double>(), 0);
    EXPECT_GE(j.at("num_zeros").get<int64_t>(), (128 - 64) * 32);  // the padded vocabulary's embedding rows
  }
  const auto& last = l.lines.back();
  EXPECT_NEAR(last.at("params_norm").get<double>(), l.params_norm, 1e-12 * l.params_norm);
  EXPECT_EQ(last.at("num_zeros").get<int64_t>(), l.zeros);
  EXPECT_NE(l.console.find(fmt::format("| params norm: {:.3f} |", l.params_norm)), std::string::npos) << l.console;
  EXPECT_NE(l.console.find(fmt::format("| num zeros: {} |", l.zeros)), std::string::npos) << l.console;
  // The params norm moves with the updates.
  EXPECT_NE(l.lines[0].at("params_norm").get<double>(), l.lines[2].at("params_norm").get<double>());
}

TEST(LoggingLine, FlagsOffLeaveTheLineAndFileAsBefore) {
  const Logged l = run_logged({}, 1);
  for (const char* s : {"throughput per GPU", "num zeros", "params norm", "per layer"})
    EXPECT_EQ(l.console.find(s), std::string::npos) << s;
  ASSERT_EQ(l.lines.size(), 1u);
  for (const char* k : {"throughput_tflops_per_gpu", "num_zeros", "params_norm", "moe/load_balancing_loss_layer_0"})
    EXPECT_FALSE(l.lines[0].contains(k)) << k;
}

// Megatron's per-layer keys, moe/<name>_layer_<i> with i the layer's index: their mean over the MoE layers is the
// logged total (with --log-interval 1 the total is the last step's).
TEST(LoggingLine, PerLayerMoELossesAverageToTheTotal) {
  const Logged l = run_logged({"--moe-per-layer-logging", "--moe-router-load-balancing-type", "aux_loss",
                               "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2", "1e-3", "--moe-z-loss-coeff", "1e-3"});
  EXPECT_NE(l.console.find("| load_balancing_loss per layer: "), std::string::npos) << l.console;
  EXPECT_NE(l.console.find("| seq_load_balancing_loss per layer: "), std::string::npos) << l.console;
  EXPECT_NE(l.console.find("| z_loss per layer: "), std::string::npos) << l.console;
  ASSERT_EQ(l.lines.size(), 3u);
  for (const auto& j : l.lines)
    for (const std::string name : {"load_balancing_loss", "seq_load_balancing_loss", "z_loss"}) {
      const double a = j.at("moe/" + name + "_layer_0").get<double>(),
                   b = j.at("moe/" + name + "_layer_1").get<double>();
      EXPECT_GT(a, 0);
      EXPECT_NE(a, b) << name;  // two layers, two values
      EXPECT_NEAR((a + b) / 2, j.at(name).get<double>(), 1e-12 * j.at(name).get<double>()) << name;
      EXPECT_FALSE(j.contains("moe/" + name + "_layer_2"));
    }
}

// Zero weights: the gradients vanish and the stall alarm warns after 5 steps, unless --logging-level is above
// WARNING (30), as Python's logging would hide Megatron's warnings.
TEST(LoggingLevel, HidesWarningsAboveThirty) {
  for (const char* level : {"30", "40"}) {
    const Logged l = run_logged({"--init-method-std", "0", "--logging-level", level}, 6);
    const bool shown = l.console.find("warning: the gradient norm has been exactly 0") != std::string::npos;
    EXPECT_EQ(shown, std::string(level) == "30") << "--logging-level " << level << "\n" << l.console;
    EXPECT_NE(l.console.find(" iteration "), std::string::npos);  // the log line shows at every level
  }
}

TEST(LoggingFlags, RefusedWithTheReason) {
  auto refusal = [](const std::vector<std::string>& extra) {
    return testing::user_error_of([&] {
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 1, "1e-3"), extra);
    });
  };
  EXPECT_NE(refusal({"--log-progress"}).find("--log-progress"), std::string::npos);
  EXPECT_EQ(testing::error_of([] {
              testing::small_config(
                  testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 1, "1e-3"),
                  {"--log-params-norm", "--use-distributed-optimizer", "--log-throughput", "--log-num-zeros-in-grad"});
            }),
            "");
}

}  // namespace
}  // namespace moecore
