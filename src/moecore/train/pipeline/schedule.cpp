// Micro-batch schedules (see schedule.h).
#include "moecore/train/pipeline/schedule.h"

#include <optional>

#include "moecore/core/timers.h"
#include "moecore/train/pipeline/combined_1f1b.h"

namespace moecore::train {

double loss_tokens(const data::Batch& b) {
  double n = 0;
  const float* m = b.loss_mask.data<float>();
  for (int64_t i = 0; i < b.loss_mask.numel(); i++) n += m[i];
  return n;
}

StepLoss NoPipelining::forward_backward(nn::GPTModel& model, nn::GPTModel::Stash& stash, const data::SampleSource& data,
                                        const data::SampleCursor& cursor, const MicroBatches& mb,
                                        optim::ChainedOptimizer& opt) {
  auto samples = [&](int64_t m) { return cursor.micro_batch(m, mb.dp_rank, mb.dp_size, mb.size); };
  // Per-token loss needs the global batch's loss tokens before the first backward (Megatron divides by them in
  // finalize_model_grads; here the backward scales by them, so the bucket reductions can still overlap it).
  std::vector<data::Batch> batches;
  double global_tokens = 0;
  if (mb.per_token_loss) {
    for (int64_t m = 0; m < mb.count; m++) {
      TimerScope timer("batch-generator", 2);  // Megatron's level-2 timers of the micro-batch loop
      batches.push_back(data::make_batch(data, samples(m), mb.eod_mask_token));
      global_tokens += loss_tokens(batches.back());
    }
    if (mb.dp) {
      Tensor t = Tensor::empty({1}, DType::F64);
      t.set_item(0, global_tokens);
      mb.dp->all_reduce(t);
      global_tokens = t.item(0) / static_cast<double>(mb.cp_size);  // each CP rank counted its sequences' tokens
    }
  }
  // dp: the ranks gradients are averaged over (DP×CP); each CP rank's aux losses are partial sums, which Megatron
  // scales by CP so that the average leaves their sum.
  const double scale = 1.0 / static_cast<double>(mb.count), dp = static_cast<double>(mb.dp_size * mb.cp_size),
               cp = static_cast<double>(mb.cp_size);
  const TokenScale token_scale_of{mb.per_token_loss, global_tokens, dp, mb.count, mb.loss_scale};
  StepLoss loss;
  // The forward of micro-batch m into stash `st`, then its backward (the loss's token and aux scales kept between).
  struct Scales {
    double token = 0, aux = 0;
  };
  std::vector<Scales> scales(static_cast<size_t>(mb.count));
  auto forward = [&](int64_t m, nn::GPTModel::Stash& st) {
    std::optional<TimerScope> batch_timer(std::in_place, "batch-generator", 2);
    st.sample_B = samples(m);  // also the dropout masks' sample indices
    const data::Batch b = mb.per_token_loss ? std::move(batches[static_cast<size_t>(m)])
                                            : data::make_batch(data, st.sample_B, mb.eod_mask_token);
    batch_timer.reset();
    st.token_scale_of = token_scale_of;
    std::optional<TimerScope> forward_timer(std::in_place, "forward-compute", 2);
    const double mean = model.forward(b.tokens, b.labels, b.loss_mask, st);
    forward_timer.reset();
    loss.sum += mean * st.mask_sum;
    loss.tokens += st.mask_sum;
    Scales& sc = scales[static_cast<size_t>(m)];
    sc.token = token_scale_of(st.mask_sum);
    sc.aux = scale * cp;
    if (mb.per_token_loss) {
      // Megatron: token losses summed, every gradient divided by the global loss tokens (token_scale above); the
      // router multiplies its aux and z losses by the micro-batch's tokens (its local tokens x TP), so they keep
      // 1/(micro-batches x DP) when every token has a loss.
      sc.aux = global_tokens > 0 ? static_cast<double>(b.tokens.numel()) * dp / global_tokens : 0.0;  // B·S
    }
    sc.aux *= mb.loss_scale;  // Megatron's MoEAuxLossAutoScaler carries the loss scale too
  };
  auto backward = [&](int64_t m, nn::GPTModel::Stash& st) {
    const Scales& sc = scales[static_cast<size_t>(m)];
    TimerScope backward_timer("backward-compute", 2);
    if (opt.reduces_gradients() && m == mb.count - 1)
      model.backward_scaled(st, sc.token, sc.aux, [&opt](size_t layer) { opt.layer_grads_final(layer); });
    else
      model.backward_scaled(st, sc.token, sc.aux);
  };
  if (!combined_) {
    for (int64_t m = 0; m < mb.count; m++) {
      forward(m, stash);
      backward(m, stash);
    }
    return loss;
  }
  // Megatron's combined 1F1B without pipelining (combined_1f1b_schedule_for_no_pipelining): the first forward
  // alone, then micro-batch m's forward merged with m−1's backward, then the last backward alone. Two stashes.
  if (!second_stash_) second_stash_ = std::make_unique<nn::GPTModel::Stash>(model.make_stash());
  auto stash_of = [&](int64_t m) -> nn::GPTModel::Stash& { return m % 2 == 0 ? stash : *second_stash_; };
  forward(0, stash_of(0));
  for (int64_t m = 1; m < mb.count; m++)
    combined_forward_backward(
        m, [&, m] { forward(m, stash_of(m)); }, m - 1, [&, m] { backward(m - 1, stash_of(m - 1)); });
  backward(mb.count - 1, stash_of(mb.count - 1));
  return loss;
}

}  // namespace moecore::train
