// AdamW (decoupled weight decay, Loshchilov & Hutter), the update Megatron's FusedAdam applies with adam_w_mode:
//   p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//   p ← p − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
// with g = grad_scale · grad: gradient clipping's coefficient is applied as the gradient is read, bitwise the same
// as scaling the gradient in place first, without another pass over it. One tensor per call, or many in one pass
// (adamw_step_multi); the optimizer decides lr and wd per parameter.
#pragma once

#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_scale = 1.0;
  // Optional, GPU only: the clip state's slots (grad_clip.h ClipState) on the parameters' device; the update reads
  // the gradient scale from them instead of grad_scale, and writes nothing where their skip flag is set.
  Tensor clip{};
};

// param, m, v updated in place; grad read. All the same floating dtype (f32 master weights, or f64). step ≥ 1.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step);

// Multi-tensor AdamW: one pass over many tensors (every parameter of a model, or the slices of the distributed
// optimizer's flat shards), each with its own weight decay. The elements of all of them are split evenly over the
// threads of one parallel region, each thread a contiguous run across tensor boundaries starting on a cache line,
// so small tensors cost no fork and join of their own. Bitwise the same as adamw_step on each.
// Moments m, v in the parameters' dtype, or bf16 beside f32 parameters (Megatron's precision-aware optimizer:
// loaded to f32, updated in f32, the parameter update computed from the f32 values, rounded to nearest even on
// store).
// param_bf16 (f32 parameters, either device; optional): also receives the updated parameter rounded to bf16 (round
// to nearest even), written without a cast pass of its own: the model's bf16 weight of an f32 master in the
// optimizer (nn::Parameter::bf16_storage), or the bf16 copy of an f32 weight (nn::Parameter::low_cache).
struct AdamWTensor {
  Tensor param, grad, m, v;  // handles (slices share their storage)
  double weight_decay = 0;
  Tensor param_bf16{};  // optional (above)
};
void adamw_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step);

}  // namespace moecore::kernels
