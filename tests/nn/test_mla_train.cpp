// A GPT with Multi-Latent Attention learns on the copy task (the second half of each sequence repeats the first,
// which only position-aware attention can do: here MLA's decoupled RoPE, YaRN-scaled). Within 300 steps the loss
// of the copied half must fall below a third of the uniform prediction's (the dense GPT of test_gpt.cpp reaches
// ~0 in 600; this MLA, with its rank-32 latents, ~0.3 in 600).
#include <gtest/gtest.h>

#include <cmath>

#include "copy_task.h"

namespace moecore {
namespace {

TEST(MLATrain, LearnsCopyTask) {
  nn::GPTConfig c = testing::copy_config();
  c.qk_layernorm = true;  // the latent norms
  c.mla.enabled = true, c.mla.q_lora_rank = 32, c.mla.kv_lora_rank = 32, c.mla.qk_head_dim = 16;
  c.mla.qk_pos_emb_head_dim = 16, c.mla.v_head_dim = 16;
  c.mla.yarn_params.scaling_factor = 2, c.mla.yarn_params.original_max_position_embeddings = 64;
  c.mla.yarn_params.mscale_all_dim = 1;
  testing::Trainer t(c);
  t.decay_steps = 300;
  double first = 0, last = 0;
  int s = 0;
  for (; s < 300; s++) {
    const double loss = t.train_step(testing::copy_batch(16, 8, 16, static_cast<uint64_t>(s)));
    if (s == 0) first = loss;
    last = loss;
    if (s >= 50 && loss < 0.01) break;
  }
  EXPECT_NEAR(first, std::log(16.0), 0.3) << "an untrained model predicts uniformly";
  EXPECT_LT(last, first / 3) << "the copy task must be learning (step " << s << ")";
}

}  // namespace
}  // namespace moecore
