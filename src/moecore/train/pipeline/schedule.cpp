// Micro-batch schedules (see schedule.h).
#include "moecore/train/pipeline/schedule.h"

#include <optional>

#include "moecore/core/timers.h"

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
  for (int64_t m = 0; m < mb.count; m++) {
    std::optional<TimerScope> batch_timer(std::in_place, "batch-generator", 2);
    stash.sample_B = samples(m);  // also the dropout masks' sample indices
    const data::Batch b = mb.per_token_loss ? std::move(batches[static_cast<size_t>(m)])
                                            : data::make_batch(data, stash.sample_B, mb.eod_mask_token);
    batch_timer.reset();
    stash.token_scale_of = token_scale_of;
    std::optional<TimerScope> forward_timer(std::in_place, "forward-compute", 2);
    const double mean = model.forward(b.tokens, b.labels, b.loss_mask, stash);
    forward_timer.reset();
    loss.sum += mean * stash.mask_sum;
    loss.tokens += stash.mask_sum;
    const double token_scale = token_scale_of(stash.mask_sum);
    double aux_scale = scale * cp;
    if (mb.per_token_loss) {
      // Megatron: token losses summed, every gradient divided by the global loss tokens (token_scale above); the
      // router multiplies its aux and z losses by the micro-batch's tokens (its local tokens x TP), so they keep
      // 1/(micro-batches x DP) when every token has a loss.
      aux_scale = global_tokens > 0 ? static_cast<double>(b.tokens.numel()) * dp / global_tokens : 0.0;  // B·S
    }
    aux_scale *= mb.loss_scale;  // Megatron's MoEAuxLossAutoScaler carries the loss scale too
    TimerScope backward_timer("backward-compute", 2);
    if (opt.reduces_gradients() && m == mb.count - 1)
      model.backward_scaled(stash, token_scale, aux_scale, [&opt](size_t layer) { opt.layer_grads_final(layer); });
    else
      model.backward_scaled(stash, token_scale, aux_scale);
  }
  return loss;
}

}  // namespace moecore::train
