// Multi-Latent Attention's forward against an independent float64 NumPy transcription of HuggingFace's
// DeepseekV3Attention (tests/models/deepseek_v3_reference.py: rope_interleave, YaRN tables, causal eager
// attention). The weights go over as JSON under HF's names.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moecore/nn/mla_attention.h"
#include "test_util.h"

namespace moecore {
namespace {

nlohmann::json matrix(const Tensor& w) {  // [out, in] (or [dim]) as nested lists
  nlohmann::json j = nlohmann::json::array();
  if (w.ndim() == 1) {
    for (int64_t i = 0; i < w.numel(); i++) j.push_back(w.item(i));
    return j;
  }
  for (int64_t r = 0; r < w.dim(0); r++) {
    nlohmann::json row = nlohmann::json::array();
    for (int64_t c = 0; c < w.dim(1); c++) row.push_back(w.item(r * w.dim(1) + c));
    j.push_back(row);
  }
  return j;
}

struct RefCase {
  int64_t q_lora;
  bool norms, yarn;
  int64_t v_dim;
};

TEST(MLAReference, ForwardMatchesHuggingFaceDefinition) {
  for (RefCase c : {RefCase{12, true, true, 6}, RefCase{0, true, false, 10}, RefCase{12, false, true, 8}}) {
    nn::ParamRegistry reg(DType::F64);
    nn::AttentionConfig a;
    a.hidden = 16, a.num_heads = 4, a.max_seq_len = 32, a.init_std = 0.3, a.output_init_std = 0.2;
    a.norm_eps = 1e-6, a.qk_layernorm = c.norms, a.rotary_base = 10000;
    nn::MLAConfig m;
    m.enabled = true, m.q_lora_rank = c.q_lora, m.kv_lora_rank = 10, m.qk_head_dim = 6, m.qk_pos_emb_head_dim = 8;
    m.v_head_dim = c.v_dim, m.yarn = c.yarn;
    // A short original context so that the YaRN ramp falls inside the 4 frequencies; mscale_all_dim != 0 so
    // that HF scales the softmax too.
    m.yarn_params.scaling_factor = 8, m.yarn_params.original_max_position_embeddings = 64;
    m.yarn_params.mscale = 0.9, m.yarn_params.mscale_all_dim = 0.6;
    nn::MLAttention mla(reg, "attn", a, m);
    reg.initialize(11);
    uint64_t s = 70;
    for (auto& p : reg.all())
      if (p->init.kind != nn::InitKind::Normal)
        p->value.copy_from(testing::randn(p->value.shape(), DType::F64, s++, 0.3));
    const int64_t S = 9, B = 2, H = 16;
    const Tensor x = testing::randn({S, B, H}, DType::F64, 5);
    nn::MLAttention::Stash st;
    const Tensor y = mla.forward(x, st);

    const std::map<std::string, std::string> hf = {{"attn.linear_q_down_proj.weight", "q_a_proj"},
                                                   {"attn.q_layernorm.weight", "q_a_layernorm"},
                                                   {"attn.linear_q_up_proj.weight", "q_b_proj"},
                                                   {"attn.linear_q_proj.weight", "q_proj"},
                                                   {"attn.linear_kv_down_proj.weight", "kv_a_proj_with_mqa"},
                                                   {"attn.kv_layernorm.weight", "kv_a_layernorm"},
                                                   {"attn.linear_kv_up_proj.weight", "kv_b_proj"},
                                                   {"attn.linear_proj.weight", "o_proj"}};
    nlohmann::json weights;
    for (auto& p : reg.all()) weights[hf.at(p->name)] = matrix(p->value);
    nlohmann::json xs = nlohmann::json::array();
    for (int64_t b = 0; b < B; b++) {
      nlohmann::json seq = nlohmann::json::array();
      for (int64_t t = 0; t < S; t++) {
        nlohmann::json row = nlohmann::json::array();
        for (int64_t h = 0; h < H; h++) row.push_back(x.item((t * B + b) * H + h));
        seq.push_back(row);
      }
      xs.push_back(seq);
    }
    const nlohmann::json cfg = {
        {"num_heads", 4},        {"q_lora_rank", c.q_lora}, {"kv_lora_rank", 10},
        {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 8},   {"v_head_dim", c.v_dim},
        {"eps", 1e-6},           {"latent_norms", c.norms}, {"yarn", c.yarn},
        {"rope_theta", 10000.0}, {"factor", 8.0},           {"original_max_position_embeddings", 64},
        {"beta_fast", 32.0},     {"beta_slow", 1.0},        {"mscale", 0.9},
        {"mscale_all_dim", 0.6}};
    const std::string path = testing::fresh_temp_path("mla_case") + ".json";
    std::ofstream(path) << nlohmann::json{{"config", cfg}, {"weights", weights}, {"x", xs}}.dump();
    const std::string out = testing::python_reference("tests/models/deepseek_v3_reference.py mla " + path);
    std::remove(path.c_str());
    const auto ref = nlohmann::json::parse(out).get<std::vector<std::vector<std::vector<double>>>>();
    double max_err = 0, max_abs = 0;
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < S; t++)
        for (int64_t h = 0; h < H; h++) {
          const double want = ref[static_cast<size_t>(b)][static_cast<size_t>(t)][static_cast<size_t>(h)];
          max_err = std::max(max_err, std::abs(y.item((t * B + b) * H + h) - want));
          max_abs = std::max(max_abs, std::abs(want));
        }
    EXPECT_GT(max_abs, 1e-2) << "the case must produce real outputs";
    EXPECT_LT(max_err, 1e-12 * std::max(1.0, max_abs))
        << "q_lora=" << c.q_lora << " norms=" << c.norms << " yarn=" << c.yarn << " v=" << c.v_dim;
  }
}

}  // namespace
}  // namespace moecore
