// HuggingFace interop: small Qwen3-MoE and Mixtral models written in HF layout with known weights (bf16, two
// safetensors shards and an index) give, through `--load-hf`, the logits an independent NumPy implementation of the
// published architectures computes (tests/ckpt/hf_reference.py, float64); HF -> native -> HF is bit-exact
// (every tensor and config.json); a native checkpoint trained here exports to an HF directory the reference reads
// back to the same logits; unsupported models are refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config_util.h"
#include "hf_test_util.h"
#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/rng.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

std::string hf_dir(const std::string& name) {
  return testing::fresh_temp_path("hf_" + name);
}

using testing::mixtral_config;
using testing::qwen3_config;
using testing::write_hf;

const std::vector<int64_t> kTokens = {5, 17, 3, 88, 42, 42, 7, 0, 95, 61, 23, 11};

// The NumPy reference's logits [S][V].
std::vector<std::vector<double>> reference_logits(const std::string& dir) {
  std::string args = "tests/ckpt/hf_reference.py " + dir;
  for (int64_t t : kTokens) args += " " + std::to_string(t);
  return nlohmann::json::parse(testing::python_reference(args)).get<std::vector<std::vector<double>>>();
}

std::vector<std::vector<double>> our_logits(train::Trainer& t) {
  Tensor tok = Tensor::empty({1, static_cast<int64_t>(kTokens.size())}, DType::I64);
  for (size_t i = 0; i < kTokens.size(); i++) tok.data<int64_t>()[i] = kTokens[i];
  const Tensor l = t.model().logits(tok);
  std::vector<std::vector<double>> out(kTokens.size());
  for (int64_t s = 0; s < l.dim(0); s++)
    for (int64_t v = 0; v < 96; v++) out[static_cast<size_t>(s)].push_back(l.item(s * l.dim(1) + v));
  return out;
}

class HFInterop : public ::testing::TestWithParam<std::string> {};

TEST_P(HFInterop, LogitsRoundTripAndExport) {
  const bool qwen = GetParam().rfind("qwen3_moe", 0) == 0;
  const std::string hf = hf_dir(GetParam() + "_in"), native = hf_dir(GetParam() + "_native"),
                    back = hf_dir(GetParam() + "_back"), trained = hf_dir(GetParam() + "_trained"),
                    exported = hf_dir(GetParam() + "_exported");
  nlohmann::json config = qwen ? qwen3_config() : mixtral_config();
  if (GetParam() == "qwen3_moe_unnormalized") config["norm_topk_prob"] = false;  // --moe-router-pre-softmax
  write_hf(hf, config);
  const auto want = reference_logits(hf);
  std::FILE* null = std::fopen("/dev/null", "w");

  // --load-hf: the architecture from config.json, the weights from the shards.
  train::Trainer direct(testing::hf_run_config({"--load-hf", hf}), null, false);
  const auto got = our_logits(direct);
  EXPECT_LT(testing::max_rel(got, want), 2e-5) << "moecore's logits vs the NumPy reference";

  // HF -> native: the same model through --load (architecture from the checkpoint).
  ckpt::convert_hf_to_native(hf, native);
  train::Trainer loaded(testing::hf_run_config({"--load", native, "--use-checkpoint-args"}), null, false);
  EXPECT_EQ(our_logits(loaded), got);

  // native -> HF: bit-exact tensors and config.json.
  ckpt::convert_native_to_hf(native, back, "", "", 1 << 14);
  testing::expect_same_tensors(hf, back);
  EXPECT_EQ(testing::slurp(hf + "/config.json"), testing::slurp(back + "/config.json"));
  EXPECT_TRUE(fs::exists(back + "/model-00002-of-" +
                         fmt::format("{:05d}",
                                     [&] {
                                       int n = 0;
                                       for (const auto& e : fs::directory_iterator(back))
                                         n += e.path().extension() == ".safetensors";
                                       return n;
                                     }()) +
                         ".safetensors"))
      << "small shards: several files";

  // A model trained here (one step from the HF weights) exports with a generated config.json that the reference
  // reads back to our logits.
  {
    train::Trainer t(testing::hf_run_config({"--load-hf", hf, "--save", trained}), null, false);
    t.train_step();
    t.save_checkpoint();
    const std::string kind = qwen ? "qwen3_moe" : "mixtral";
    ckpt::convert_native_to_hf(trained, exported, kind, "f32", 1 << 20);
    EXPECT_LT(testing::max_rel(our_logits(t), reference_logits(exported)), 2e-5) << "exported model vs the reference";
  }
  std::fclose(null);
  for (const auto& d : {hf, native, back, trained, exported}) fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Architectures, HFInterop, ::testing::Values("qwen3_moe", "qwen3_moe_unnormalized", "mixtral"));

// Imported weights are checked finite before any step: a NaN in the HF files is named, not trained on.
TEST(HFInterop, RefusesNonFiniteWeightsNamingTheTensor) {
  const std::string hf = hf_dir("nan");
  write_hf(hf, qwen3_config(), "model.layers.1.self_attn.o_proj.weight");
  std::FILE* null = std::fopen("/dev/null", "w");
  const std::string e = error_of([&] { train::Trainer t(testing::hf_run_config({"--load-hf", hf}), null, false); });
  std::fclose(null);
  EXPECT_NE(e.find("the model loaded from " + hf), std::string::npos) << e;
  EXPECT_NE(e.find("decoder.layers.1.self_attention.linear_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("holds NaN or infinite values"), std::string::npos) << e;
  fs::remove_all(hf);
}

TEST(HFInterop, RefusesWhatItCannotMapByName) {
  const std::string hf = hf_dir("refuse");
  nlohmann::json c = qwen3_config();
  write_hf(hf, c);
  // An extra tensor (a bias) would be dropped: refused, naming it.
  ckpt::write_safetensors(hf + "/model.safetensors.extra", {});
  {
    nlohmann::json idx = nlohmann::json::parse(testing::slurp(hf + "/model.safetensors.index.json"));
    idx["weight_map"]["model.layers.1.self_attn.q_proj.bias"] = "model-00001-of-00002.safetensors";
    std::ofstream(hf + "/model.safetensors.index.json") << idx.dump();
  }
  std::string e = error_of([&] { ckpt::HFModel m(hf); });
  EXPECT_NE(e.find("model.layers.1.self_attn.q_proj.bias"), std::string::npos) << e;
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  e = error_of([&] { ckpt::hf_architecture(c, "config.json"); });
  EXPECT_NE(e.find("rope_scaling"), std::string::npos) << e;
  c = qwen3_config();
  c["model_type"] = "llama";
  c["architectures"] = {"LlamaForCausalLM"};
  e = error_of([&] { ckpt::hf_architecture(c, "config.json"); });
  EXPECT_NE(e.find("LlamaForCausalLM"), std::string::npos) << e;
  // A moecore model with shared experts and sigmoid routing has no Mixtral form.
  nlohmann::json flags = testing::small_moe_flags();
  flags.update({{"moe-shared-expert-intermediate-size", 16}, {"moe-router-score-function", "sigmoid"}});
  e = error_of([&] { ckpt::architecture_from_flags(flags, 96, "mixtral"); });
  EXPECT_NE(e.find("shared experts, sigmoid routing"), std::string::npos) << e;
  // Nor does one with Megatron's default LayerNorm and learned absolute positions (the HF classes have RMSNorm and
  // RoPE); a checkpoint that names neither (saved before the flags existed) is RMSNorm and RoPE.
  flags.erase("moe-shared-expert-intermediate-size");
  flags.erase("moe-router-score-function");
  EXPECT_EQ(error_of([&] { ckpt::architecture_from_flags(flags, 96, "mixtral"); }), "");
  flags["normalization"] = "LayerNorm";
  flags["position-embedding-type"] = "learned_absolute";
  e = error_of([&] { ckpt::architecture_from_flags(flags, 96, "mixtral"); });
  EXPECT_NE(e.find("it has LayerNorm (the HF classes use RMSNorm: train with --normalization RMSNorm), "
                   "--position-embedding-type learned_absolute"),
            std::string::npos)
      << e;
  fs::remove_all(hf);
}

// Progress of the conversions (core/progress.h): with the test-only MOECORE_TEST_PROGRESS_SECONDS=0 and stderr
// not a terminal, plain lines and a summary; without it (quick work) nothing at all.
TEST(HFProgress, ConversionsShowPlainLinesAndASummaryOnlyWhenAsked) {
  const std::string hf = hf_dir("progress_in"), native = hf_dir("progress_native"), back = hf_dir("progress_back"),
                    quiet = hf_dir("progress_quiet");
  write_hf(hf, mixtral_config());
  setenv("MOECORE_TEST_PROGRESS_SECONDS", "0", 1);
  ::testing::internal::CaptureStderr();
  ckpt::convert_hf_to_native(hf, native);
  ckpt::convert_native_to_hf(native, back, "", "", 1 << 14);
  const std::string err = ::testing::internal::GetCapturedStderr();
  unsetenv("MOECORE_TEST_PROGRESS_SECONDS");
  EXPECT_NE(err.find("HF import: 100.0% "), std::string::npos) << err;
  EXPECT_NE(err.find("HF import: read "), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint save: 100.0% "), std::string::npos) << err;
  EXPECT_NE(err.find("HF export: 0.0% "), std::string::npos) << err;
  EXPECT_NE(err.find("HF export: wrote "), std::string::npos) << err;
  EXPECT_NE(err.find(" MB/s elapsed "), std::string::npos) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << "not a terminal: plain lines";
  ::testing::internal::CaptureStderr();
  ckpt::convert_native_to_hf(native, quiet, "", "", 1 << 14);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "a quick conversion prints nothing";
  for (const auto& d : {hf, native, back, quiet}) fs::remove_all(d);
}

}  // namespace
}  // namespace moecore
