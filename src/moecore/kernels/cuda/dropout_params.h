// The pointer-level dropout argument (launch_dropout.h) from the API's masks (kernels/dropout.h, kernels/attention.h),
// for the Tensor-level CUDA entry points: hidden dropout (dropout.cpp) and attention (attention_ops.cpp).
#pragma once

#include <cstdint>

#include "moecore/core/error.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cuda/launch_dropout.h"
#include "moecore/kernels/dropout.h"

namespace moecore::kernels::cuda::detail {

// The mask m over B sequences of global sample indices sample[0 .. B), rows from global position row_offset.
inline launch::DropoutParams dropout_params(const DropoutMask& m, const int64_t* sample, int64_t B,
                                            int64_t row_offset) {
  MOE_CHECK(B <= launch::kDropoutMaxSamples,
            "dropout on the GPU takes micro-batches of up to {} sequences, got {}: lower --micro-batch-size (more "
            "micro-batches give the same global batch)",
            launch::kDropoutMaxSamples, B);
  MOE_ASSERT(B > 0 && sample != nullptr);
  launch::DropoutParams p;
  p.on = m.on() ? 1 : 0;
  p.threshold = m.threshold;
  p.keep = static_cast<float>(1.0 / (1.0 - m.p));  // the CPU kernels' f32 multiplier
  p.key = m.key64();
  p.row_offset = row_offset;
  p.samples = B;
  for (int64_t b = 0; b < B; b++) p.sample[b] = sample[b];
  return p;
}

// Attention dropout of a call over B sequences: off (p.on 0) when null or off.
inline launch::DropoutParams attention_dropout_params(const AttentionDropout* d, int64_t B) {
  if (!d || !d->on()) return {};
  launch::DropoutParams p = dropout_params(d->mask, d->sample_B, B, d->seq_offset);
  p.keep = d->keep();
  p.head_offset = d->head_offset;
  p.col_offset = d->key_offset < 0 ? d->seq_offset : d->key_offset;
  return p;
}

}  // namespace moecore::kernels::cuda::detail
