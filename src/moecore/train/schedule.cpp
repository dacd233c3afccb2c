// Micro-batch schedules (see schedule.h).
#include "moecore/train/schedule.h"

namespace moecore::train {

double NoPipelining::forward_backward(nn::GPTModel& model, nn::GPTModel::Stash& stash, const data::SampleSource& data,
                                      const data::SampleCursor& cursor, const MicroBatches& mb,
                                      optim::ChainedOptimizer& opt) {
  const double scale = 1.0 / static_cast<double>(mb.count);
  double loss = 0;
  for (int64_t m = 0; m < mb.count; m++) {
    stash.sample_B = cursor.micro_batch(m, mb.dp_rank, mb.dp_size, mb.size);  // dropout masks' sample indices
    const data::Batch b = data::make_batch(data, stash.sample_B);
    loss += model.forward(b.tokens, b.labels, b.loss_mask, stash) * scale;
    if (opt.reduces_gradients() && m == mb.count - 1)
      model.backward(stash, scale, [&opt](size_t layer) { opt.layer_grads_final(layer); });
    else
      model.backward(stash, scale);
  }
  return loss;
}

}  // namespace moecore::train
