// Megatron's fp16/bf16 main gradients, emulated: storage stays f32 (f64 in gradient checks) and the values are
// rounded to the low dtype exactly where Megatron rounds them, as moecore emulates fp16/bf16 GEMM operands.
//
// Megatron's rounding points (megatron/training/arguments.py, core/distributed/param_and_grad_buffer.py,
// distributed_data_parallel.py, core/optimizer/optimizer.py, core/distributed/fsdp/):
//  - The gradient buffer's dtype (group_params_for_buffers): fp32 with grad_reduce_in_fp32
//    (--accumulate-allreduce-grads-in-fp32), else the parameter's dtype: fp16 under --fp16, bf16 under --bf16 where
//    --grad-reduce-in-bf16 (or --main-grads-dtype bf16 with the precision-aware optimizer) turns the fp32 default
//    off. param.main_grad is a view into that buffer, so
//    (a) each micro-batch's weight gradient is accumulated into it and rounded once: TE's fused wgrad accumulation
//        computes main_grad + dW in fp32 and stores it in fp16/bf16 (an overflow is inf);
//    (b) before the data-parallel collective the buffer is multiplied by gradient_scaling_factor (1/DP, in the
//        buffer's dtype: one rounding), then all-reduced (or reduce-scattered, for the distributed optimizer, and
//        over the expert-data-parallel group for experts) in that dtype: NCCL's ring sums partial sums in the dtype;
//    (c) Float16OptimizerWithFloat16Params / the distributed optimizer copy the reduced main gradient to fp32
//        (main_param.grad = main_grad.float()), unscale by 1/loss_scale in fp32 and check for inf/NaN: a found inf
//        skips the step and backs the dynamic loss scale off.
//  - Megatron FSDP: main_grads_dtype (auto: the model's compute dtype) is the dtype of the gradient shards a
//    micro-batch's reduce-scattered gradients accumulate into; grad_comm_dtype (auto: main_grads_dtype) the dtype
//    the per-micro-batch unit gradients are reduce-scattered in (rounded before, partial sums in it), then added
//    into the main shard and rounded to main_grads_dtype.
// Here: the values are rounded to the dtype before the collective, the 1/DP scale applied (rounded) before it as
// Megatron does, and the partial sums taken in rank order with a rounding after each addition (deterministic and
// the same on every rank, so runs are bitwise reproducible); the optimizer then reads them as f32.
#pragma once

#include "moecore/comm/process_group.h"
#include "moecore/core/tensor.h"

namespace moecore::optim {

// The dtypes of a run's main gradients (train/config/optimizer_config.cpp resolves Megatron's flags into them):
// `main`, what each micro-batch's gradient is accumulated in (rounded after each micro-batch); `comm`, what the
// data-parallel collectives reduce in. F32 both: moecore's fp32 gradients, no rounding anywhere.
struct GradPrecision {
  DType main = DType::F32, comm = DType::F32;
  // Any rounding: the reductions then go through the functions below, pre-scaled by 1/DP as Megatron's.
  bool low() const { return main != DType::F32 || comm != DType::F32; }
};

// Rounds every element of `t` (f32 or f64, on the host) to `low` (BF16 or F16) in place, keeping its dtype: round
// to nearest even, an overflow of f16 becomes inf. F32 (or F64): nothing.
void round_to_dtype(Tensor& t, DType low);

// The sum of `t` over `group` as a reduction in `low` computes it, written into `t` on every rank: each rank's
// values rounded to `low` and multiplied by `pre_scale` (Megatron's gradient_scaling_factor, rounded again), then
// summed in rank order with every partial sum rounded to `low`. Bitwise the same on every rank and every run.
void low_precision_all_reduce(const comm::ProcessGroup& group, Tensor& t, DType low, double pre_scale);
// The same reduction, of which this rank keeps only its shard: `buf` [n·size] reduced, the shard
// [rank·n, (rank+1)·n) written in place (the rest of buf left as it was, rounded and scaled).
void low_precision_reduce_scatter_in_place(const comm::ProcessGroup& group, Tensor& buf, DType low, double pre_scale);

}  // namespace moecore::optim
