// Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm without --delay-wgrad-compute; combined_1f1b.py,
// model_chunk_schedule_plan.py): one micro-batch's forward merged with another's backward, layer by layer, so that
// every MoE all-to-all of one is in flight while the other computes. Here the backward runs on the caller's stack
// and the forward on a Fiber (core/fiber.h), and the two alternate at each MoE layer's sub-step boundary
// (nn/substeps.h: Megatron's order), backward first; what either computes is what it computes alone, and gradients
// accumulate in micro-batch order, so losses and gradients are bitwise those of the plain schedule. Not the choice
// of which passes to merge (schedule.cpp).
#pragma once

#include <cstdint>
#include <functional>

namespace moecore::train {

// Runs backward() of micro-batch b_mb with forward() of micro-batch f_mb interleaved into it; returns when both are
// done. Either may be empty (then the other runs alone).
void combined_forward_backward(int64_t f_mb, const std::function<void()>& forward, int64_t b_mb,
                               const std::function<void()>& backward);

}  // namespace moecore::train
