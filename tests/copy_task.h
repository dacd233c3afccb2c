// The copy-task trainer shared by the dense and MoE end-to-end tests: batches whose second half repeats the
// first, and a minimal training loop over a GPTModel with optim/'s AdamW and LR schedule.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "model_util.h"
#include "moecore/core/rng.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/adamw.h"
#include "moecore/optim/lr_schedule.h"

namespace moecore::testing {

// Copy task: the second half of each sequence repeats the first; the loss counts only the copied half.
struct CopyBatch {
  Tensor tokens, labels, mask;
};

inline CopyBatch copy_batch(int64_t B, int64_t half, int64_t vocab, uint64_t step) {
  const int64_t S = 2 * half - 1;  // inputs seq[0..2h-2], labels seq[1..2h-1]
  CopyBatch cb{Tensor::empty({B, S}, DType::I64), Tensor::empty({B, S}, DType::I64), Tensor::empty({B, S}, DType::F32)};
  Philox rng(99, step);
  for (int64_t b = 0; b < B; b++) {
    std::vector<int64_t> seq(2 * half);
    for (int64_t i = 0; i < half; i++) seq[i] = seq[i + half] = rng.block(b * half + i)[0] % vocab;
    for (int64_t s = 0; s < S; s++) {
      cb.tokens.data<int64_t>()[b * S + s] = seq[s];
      cb.labels.data<int64_t>()[b * S + s] = seq[s + 1];
      cb.mask.data<float>()[b * S + s] = s + 1 >= half ? 1.0f : 0.0f;
    }
  }
  return cb;
}

// The small dense GPT both copy-task tests train (the MoE test swaps its FFNs).
inline nn::GPTConfig copy_config() {
  return small_gpt({.hidden = 64,
                    .ffn = 128,
                    .heads = 4,
                    .kv_heads = 2,
                    .head_dim = 16,
                    .vocab = 16,
                    .max_seq = 32,
                    .init_std = 0.02});
}

struct Trainer {
  nn::ParamRegistry reg;
  nn::GPTModel model;
  nn::GPTModel::Stash st;
  std::unique_ptr<optim::AdamW> adam;
  int64_t step = 0;
  kernels::AdamWParams hp{3e-3, 0.9, 0.98, 1e-8, 0.0};

  explicit Trainer(const nn::GPTConfig& c, nn::FfnFactory ffn = nullptr)
      : reg(DType::F32), model(c, reg, std::move(ffn)), st(model.make_stash()) {
    reg.initialize(7);
    std::vector<nn::Parameter*> params;
    for (auto& p : reg.all()) params.push_back(p.get());
    adam = std::make_unique<optim::AdamW>(params);
  }
  // Linear warmup over 20 steps, then cosine decay to 5% over `decay_steps` (0: constant): Megatron's schedule.
  int64_t decay_steps = 0;
  std::function<void()> after_backward;  // end-of-global-batch work, e.g. MoE expert-bias updates
  double base_lr = 3e-3;
  double train_step(const CopyBatch& b) {
    if (decay_steps > 0) {
      optim::LRSchedule s;
      s.max_lr = base_lr;
      s.min_lr = 0.05 * base_lr;
      s.warmup_iters = 20;
      s.decay_iters = decay_steps;
      s.style = "cosine";
      hp.lr = s.lr(step);
    }
    reg.zero_grad();
    const double loss = model.forward(b.tokens, b.labels, b.mask, st);
    model.backward(st);
    if (after_backward) after_backward();
    step++;
    adam->step(hp, step);
    return loss;
  }
};

}  // namespace moecore::testing
