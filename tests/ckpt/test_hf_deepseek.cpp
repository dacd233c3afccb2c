// HuggingFace DeepseekV3ForCausalLM interop (DeepSeek-V3 and Kimi-K2): small models written in HF layout with
// known weights give, through --load-hf, the logits, MTP logits and losses of an independent float64 NumPy forward
// (tests/models/deepseek_v3_reference.py model: MLA with YaRN, sigmoid group-limited routing with the expert bias,
// shared experts, first-k dense layers, the MTP module stored as HF layer L); HF -> native -> HF is bit-exact; a
// model trained here exports to a directory the reference reads back to our logits; FP8 checkpoints (e4m3 with a
// weight_scale_inv per block) dequantize on import to exactly the bf16 twin's weights; what Megatron cannot express
// is refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config_util.h"
#include "hf_deepseek_writer.h"
#include "hf_test_util.h"
#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/allocator.h"
#include "moecore/core/rng.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::deepseek_config;
using testing::error_of;
using testing::kimi_config;
using testing::write_deepseek;

const std::vector<int64_t> kIds = {5, 17, 3, 88, 42, 42, 7, 0, 95, 61, 23, 11};  // inputs [0, S), labels [1, S]
constexpr int64_t kVocab = 96;

struct Outputs {
  std::vector<std::vector<double>> logits;            // [S][V]
  std::vector<std::vector<std::vector<double>>> mtp;  // [D][S][V]
  double lm_loss = 0;
  std::vector<double> mtp_losses;
};

Outputs reference(const std::string& dir) {
  std::string args = "tests/models/deepseek_v3_reference.py model " + dir;
  for (int64_t t : kIds) args += " " + std::to_string(t);
  const nlohmann::json j = nlohmann::json::parse(testing::python_reference(args));
  return {j["logits"].get<std::vector<std::vector<double>>>(),
          j["mtp_logits"].get<std::vector<std::vector<std::vector<double>>>>(), j["lm_loss"].get<double>(),
          j["mtp_losses"].get<std::vector<double>>()};
}

std::vector<std::vector<double>> rows(const Tensor& l, int64_t S) {  // [S·1, V'] -> [S][V]
  std::vector<std::vector<double>> out(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; s++)
    for (int64_t v = 0; v < kVocab; v++) out[static_cast<size_t>(s)].push_back(l.item(s * l.dim(1) + v));
  return out;
}

// moecore's logits, MTP logits and losses for kIds (evaluation mode: the expert bias and statistics stay).
Outputs ours(train::Trainer& t) {
  const int64_t S = static_cast<int64_t>(kIds.size()) - 1;
  Tensor tok = Tensor::empty({1, S}, DType::I64), lab = Tensor::empty({1, S}, DType::I64);
  for (int64_t s = 0; s < S; s++) {
    tok.data<int64_t>()[s] = kIds[static_cast<size_t>(s)];
    lab.data<int64_t>()[s] = kIds[static_cast<size_t>(s + 1)];
  }
  nn::GPTModel& m = t.model();
  m.set_training(false);
  Outputs o;
  o.logits = rows(m.logits(tok), S);
  nn::GPTModel::Stash st = m.make_stash();
  o.lm_loss = m.forward(tok, lab, Tensor(), st);
  for (const auto& d : st.mtp.depths) {
    o.mtp.push_back(rows(d.logits_TV, S));
    o.mtp_losses.push_back(d.loss);
  }
  m.set_training(true);
  return o;
}

void expect_matches(const Outputs& got, const Outputs& want, const std::string& what) {
  EXPECT_LT(testing::max_rel(got.logits, want.logits), 2e-5) << what << ": logits";
  EXPECT_NEAR(got.lm_loss, want.lm_loss, 1e-5) << what << ": lm loss";
  ASSERT_EQ(got.mtp.size(), want.mtp.size()) << what;
  for (size_t k = 0; k < got.mtp.size(); k++) {
    EXPECT_LT(testing::max_rel(got.mtp[k], want.mtp[k]), 2e-5) << what << ": MTP depth " << k + 1 << " logits";
    EXPECT_NEAR(got.mtp_losses[k], want.mtp_losses[k], 1e-5) << what << ": MTP depth " << k + 1 << " loss";
  }
}

class DeepSeekV3HF : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepSeekV3HF, MatchesTheReferenceRoundTripsAndExports) {
  const std::string name = GetParam();
  const std::string hf = testing::fresh_temp_path("ds_" + name + "_in"),
                    native = testing::fresh_temp_path("ds_" + name + "_native"),
                    back = testing::fresh_temp_path("ds_" + name + "_back"),
                    trained = testing::fresh_temp_path("ds_" + name + "_trained"),
                    exported = testing::fresh_temp_path("ds_" + name + "_exported");
  write_deepseek(hf, name == "kimi_k2" ? kimi_config() : deepseek_config());
  const Outputs want = reference(hf);
  ASSERT_EQ(want.mtp.size(), name == "kimi_k2" ? 0u : 1u);
  std::FILE* null = std::fopen("/dev/null", "w");

  train::Trainer direct(testing::hf_run_config({"--load-hf", hf}), null, false);
  const Outputs got = ours(direct);
  expect_matches(got, want, "--load-hf vs the NumPy reference");

  // HF -> native -> (--load) the same logits; native -> HF bit-exact (the expert bias stays f32).
  ckpt::convert_hf_to_native(hf, native);
  train::Trainer loaded(testing::hf_run_config({"--load", native, "--use-checkpoint-args"}), null, false);
  const Outputs again = ours(loaded);
  EXPECT_EQ(again.logits, got.logits);
  EXPECT_EQ(again.mtp, got.mtp);
  ckpt::convert_native_to_hf(native, back, "", "", 1 << 14);
  testing::expect_same_tensors(hf, back);
  EXPECT_EQ(testing::slurp(hf + "/config.json"), testing::slurp(back + "/config.json"));

  // Two steps from the HF weights (the expert bias moves: rate 1e-2) export with a generated config.json that the
  // reference reads back to our outputs.
  {
    train::Trainer t(
        testing::hf_run_config({"--load-hf", hf, "--save", trained, "--moe-router-bias-update-rate", "1e-2"}), null,
        false);
    const Tensor bias0 = t.moe_layers().front()->router().expert_bias().clone();
    t.train_step();
    t.train_step();
    EXPECT_NE(std::memcmp(bias0.raw(), t.moe_layers().front()->router().expert_bias().raw(), bias0.nbytes()), 0)
        << "the expert bias must have moved for the export to show it";
    t.save_checkpoint();
    ckpt::convert_native_to_hf(trained, exported, "deepseek_v3", "f32", 1 << 20);
    expect_matches(ours(t), reference(exported), "exported model vs the reference");
  }
  std::fclose(null);
  for (const auto& d : {hf, native, back, trained, exported}) fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Models, DeepSeekV3HF, ::testing::Values("deepseek_v3", "kimi_k2"));

TEST(DeepSeekV3HF, Fp8CheckpointDequantizesToTheBf16Model) {
  const std::string bf16 = testing::fresh_temp_path("ds_fp8_twin"), fp8 = testing::fresh_temp_path("ds_fp8"),
                    native = testing::fresh_temp_path("ds_fp8_native"), out = testing::fresh_temp_path("ds_fp8_out");
  nlohmann::json c = deepseek_config();
  c["intermediate_size"] = 40;
  write_deepseek(bf16, c);
  write_deepseek(fp8, c, 16);  // 16×16 blocks: every weight spans several, some partial
  {
    ckpt::SafetensorsFile f(fp8 + "/model-00002-of-00002.safetensors");  // layer 0's
    ASSERT_TRUE(f.entries().at("model.layers.0.mlp.down_proj.weight").f8_e4m3);
    ASSERT_EQ(f.read("model.layers.0.mlp.down_proj.weight_scale_inv").shape(), Shape({2, 3}));  // [32, 40] / 16
  }
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer a(testing::hf_run_config({"--load-hf", bf16}), null, false),
      b(testing::hf_run_config({"--load-hf", fp8}), null, false);
  const Outputs from_fp8 = ours(b);
  EXPECT_EQ(from_fp8.logits, ours(a).logits) << "the dequantized weights are the bf16 twin's exactly";
  expect_matches(from_fp8, reference(fp8), "FP8 import vs the reference's own dequantization");
  // The export holds the dequantized model in bf16: the twin's tensors, a config without quantization_config.
  ckpt::convert_hf_to_native(fp8, native);
  ckpt::convert_native_to_hf(native, out, "", "", 1 << 20);
  testing::expect_same_tensors(bf16, out);
  const nlohmann::json oc = nlohmann::json::parse(testing::slurp(out + "/config.json"));
  EXPECT_FALSE(oc.contains("quantization_config"));
  EXPECT_EQ(oc["torch_dtype"], "bfloat16");
  // A weight without its scale, and a wrong-shaped scale, are named.
  {
    nlohmann::json idx = nlohmann::json::parse(testing::slurp(fp8 + "/model.safetensors.index.json"));
    idx["weight_map"].erase("model.layers.1.self_attn.o_proj.weight_scale_inv");
    std::ofstream(fp8 + "/model.safetensors.index.json") << idx.dump();
    const std::string e = error_of([&] { train::Trainer t(testing::hf_run_config({"--load-hf", fp8}), null, false); });
    EXPECT_NE(e.find("model.layers.1.self_attn.o_proj.weight is FP8 but"), std::string::npos) << e;
    EXPECT_NE(e.find("o_proj.weight_scale_inv to dequantize it with"), std::string::npos) << e;
  }
  // A scale beside a weight that is not FP8 would be ignored: refused, naming both.
  {
    ckpt::write_safetensors(bf16 + "/extra.safetensors",
                            {{"model.layers.1.self_attn.o_proj.weight_scale_inv", Tensor::zeros({1, 1}, DType::F32)}});
    nlohmann::json idx = nlohmann::json::parse(testing::slurp(bf16 + "/model.safetensors.index.json"));
    idx["weight_map"]["model.layers.1.self_attn.o_proj.weight_scale_inv"] = "extra.safetensors";
    std::ofstream(bf16 + "/model.safetensors.index.json") << idx.dump();
    const std::string e = error_of([&] { train::Trainer t(testing::hf_run_config({"--load-hf", bf16}), null, false); });
    EXPECT_NE(e.find("model.layers.1.self_attn.o_proj.weight has a model.layers.1.self_attn.o_proj.weight_scale_inv "
                     "but is not FP8 (bf16)"),
              std::string::npos)
        << e;
  }
  std::fclose(null);
  for (const auto& d : {bf16, fp8, native, out}) fs::remove_all(d);
}

// hf-to-native streams: with 4 KiB shards the native tensors are stored in chunks along their first dimension over
// many shard files, the allocator never holds more than a few chunks, and the checkpoint loads to the same bits as
// one written in large shards.
TEST(DeepSeekV3HF, ImportIsStreamedInChunks) {
  const std::string hf = testing::fresh_temp_path("ds_stream"), small = testing::fresh_temp_path("ds_stream_small"),
                    large = testing::fresh_temp_path("ds_stream_large");
  write_deepseek(hf, deepseek_config());
  Allocator::instance().reset_peak();
  const int64_t before = Allocator::instance().stats().live_bytes;
  ckpt::convert_hf_to_native(hf, small, 4096);
  const int64_t peak = Allocator::instance().stats().peak_bytes - before;
  ckpt::convert_hf_to_native(hf, large);
  int64_t files = 0, model_bytes = 0;
  for (const auto& e : fs::directory_iterator(ckpt::iteration_dir(small, -1)))
    if (e.path().extension() == ".safetensors") files++, model_bytes += static_cast<int64_t>(fs::file_size(e.path()));
  EXPECT_GT(files, 20) << "many shards";
  EXPECT_LT(peak, model_bytes / 4) << "the import held " << peak << " bytes of a " << model_bytes << "-byte model";
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer a(testing::hf_run_config({"--load", small, "--use-checkpoint-args"}), null, false),
      b(testing::hf_run_config({"--load", large, "--use-checkpoint-args"}), null, false);
  EXPECT_EQ(ours(a).logits, ours(b).logits);
  std::fclose(null);
  for (const auto& d : {hf, small, large}) fs::remove_all(d);
}

TEST(DeepSeekV3HF, RefusesWhatMegatronCannotExpress) {
  auto refusal = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = deepseek_config();
    edit(c);
    return error_of([&] { ckpt::hf_train_flags(c, "config.json"); });
  };
  EXPECT_NE(refusal([](auto& c) { c["norm_topk_prob"] = false; }).find("norm_topk_prob false"), std::string::npos);
  EXPECT_NE(refusal([](auto& c) { c["topk_group"] = 1; }).find("must be 2 (HF sums each group's top 2"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& c) { c["scoring_func"] = "softmax"; }).find("scoring_func"), std::string::npos);
  EXPECT_NE(refusal([](auto& c) { c["topk_method"] = "greedy"; }).find("topk_method"), std::string::npos);
  EXPECT_NE(refusal([](auto& c) { c["rope_scaling"]["type"] = "linear"; }).find("RoPE scaling 'linear'"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& c) { c["rope_scaling"]["mscale_all_dim"] = 0.0; }).find("mscale 0.9"), std::string::npos);
  EXPECT_NE(refusal([](auto& c) { c["first_k_dense_replace"] = 3; }).find("the MTP layers would be MoE"),
            std::string::npos);
  EXPECT_EQ(refusal([](auto& c) { c["first_k_dense_replace"] = 4; }), "") << "all dense, MTP dense: expressible";
  // The MTP layer's copies of the embedding and output head must equal the shared ones.
  const std::string hf = testing::fresh_temp_path("ds_copy");
  write_deepseek(hf, deepseek_config());
  {
    const std::string file = hf + "/model-00001-of-00002.safetensors";  // layer 3's
    ckpt::SafetensorsFile f(file);
    std::vector<ckpt::NamedTensor> all;
    for (const auto& [name, e] : f.entries()) {
      Tensor x = f.read(name);
      if (name == "model.layers.3.shared_head.head.weight") x.set_item(7, x.item(7) + 1.0);
      all.push_back({name, x});
    }
    ckpt::write_safetensors(file, all);
  }
  std::FILE* null = std::fopen("/dev/null", "w");
  const std::string e = error_of([&] { train::Trainer t(testing::hf_run_config({"--load-hf", hf}), null, false); });
  std::fclose(null);
  EXPECT_NE(e.find("model.layers.3.shared_head.head.weight differs from lm_head.weight"), std::string::npos) << e;
  fs::remove_all(hf);
  // The --yarn-* flags carry an import's YaRN to MLA; without MLA's YaRN they would change nothing.
  const std::string y = error_of([] { testing::hf_run_config({"--yarn-beta-fast", "4"}); });
  EXPECT_NE(y.find("act on the YaRN of --multi-latent-attention here"), std::string::npos) << y;
  // A moecore model DeepseekV3 has no form for.
  nlohmann::json flags = testing::small_moe_flags();
  flags.update({{"multi-latent-attention", true}, {"qk-layernorm", true}, {"moe-router-score-function", "softmax"}});
  const std::string x = error_of([&] { ckpt::architecture_from_flags(flags, 96, ""); });
  EXPECT_NE(x.find("cannot be written as deepseek_v3: it has softmax routing (DeepseekV3 routes by sigmoid "
                   "scores), no expert bias"),
            std::string::npos)
      << x;
}

}  // namespace
}  // namespace moecore
