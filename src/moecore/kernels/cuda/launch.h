// Pointer-level launchers of the CUDA kernels: the only header nvcc parses besides CUDA's own (no fmt, no Tensor),
// so the .cu files compile fast. Callers are the Tensor-level entry points in kernels.cpp (checks, shapes). Every
// launcher queues work on `s` and returns; dtype codes are moecore::DType's values (0 f32, 1 bf16, 2 f64). Element
// types: f32 unless a parameter says otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "moecore/kernels/cuda/launch_dropout.h"

namespace moecore::launch {

void fill(float* p, float v, int64_t n, cudaStream_t s);
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
void scale(float* a, float v, int64_t n, cudaStream_t s);
// Σ a_i² (kind 0), Σ a_i (1) or Σ a_i·b_i (2) in f64 over a fixed tree: the same bits on every run.
void reduce_sum(int kind, const float* a, const float* b, int64_t n, double* out_device, cudaStream_t s);

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t H, float eps,
                     cudaStream_t s);
// scratch: launch_col_reduce.h's col_reduce_scratch_floats(rows, H, 1) floats (dw's partial sums), 2 for LayerNorm.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      float* scratch, int64_t rows, int64_t H, cudaStream_t s);

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t rows,
                       int64_t H, float eps, cudaStream_t s);
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, float* scratch, int64_t rows, int64_t H, cudaStream_t s);
// The bias of a linear layer or of one expert, each row's scaled by w[t] (w null: 1):
// y[t, :] += b·w[t]; db += Σ_t w[t]·dy[t, :] (the two-stage column sum; scratch as rmsnorm_backward's) and
// dw[t] += dy[t, :]·b (a warp per row). dy is f32, or bf16 when dy_bf16 (widened as it is read); y likewise, when
// y_bf16 (the sum in f32, rounded once as it is stored).
void add_row_bias(void* y, bool y_bf16, const float* b, const float* w, int64_t rows, int64_t N, cudaStream_t s);
void accumulate_col_sums(const void* dy, bool dy_bf16, const float* w, float* db, float* scratch, int64_t rows,
                         int64_t N, cudaStream_t s);
void add_row_dots(const void* dy, bool dy_bf16, const float* b, float* dw, int64_t rows, int64_t N, cudaStream_t s);

// Rotates channels [offset, offset+rot_dim) of each [S, BN, D] row pair-wise; sign −1 is the backward.
void rope(const float* x, const float* cos_SR, const float* sin_SR, float* y, int64_t S, int64_t BN, int64_t D,
          int64_t offset, int64_t rot_dim, bool interleaved, float sign, cudaStream_t s);

// act: 0 SwiGLU, 1 GeLU, 2 squared ReLU (kernels::Activation's order). x, dy, y and dx are bf16 when *_bf16 (read
// widened to f32, written rounded to nearest even), f32 otherwise; the math is f32 either way.
void activation_forward(int act, const void* x, bool x_bf16, const float* probs, void* y, bool y_bf16, int64_t rows,
                        int64_t F, cudaStream_t s);
void activation_backward(int act, const void* dy, bool dy_bf16, const void* x, bool x_bf16, const float* probs,
                         void* dx, bool dx_bf16, float* dprobs, int64_t rows, int64_t F, cudaStream_t s);
void embedding_forward(const void* ids, bool ids64, const void* w, void* y, int64_t T, int64_t H, int64_t VL,
                       int64_t vocab_start, int elem_bytes, cudaStream_t s);
// dW[r] += Σ_{t: id[t]−vocab_start = r} dy[t], tokens in ascending order (the CPU's bits), no atomics: the tokens are
// sorted by row (embedding_bwd.cu). order_scratch: 4·T int32; sort_scratch: embedding_sort_scratch_bytes(T, VL).
size_t embedding_sort_scratch_bytes(int64_t T, int64_t VL);
void embedding_backward(const float* dy, const void* ids, bool ids64, float* dw, int64_t T, int64_t H, int64_t VL,
                        int64_t vocab_start, int32_t* order_scratch, void* sort_scratch, size_t sort_bytes,
                        cudaStream_t s);

// Cross-entropy in three steps so the vocab-parallel version can all-reduce between them (host-staged MPI).
void ce_row_max(const float* logits, int64_t rows, int64_t V, float* mx, cudaStream_t s);
// sums[t] = Σ_v exp(l − mx[t]); sums[rows + t] = the target's logit if it is in this shard, else 0.
void ce_sumexp_target(const float* logits, const void* targets, bool t64, int64_t rows, int64_t V, int64_t vocab_start,
                      const float* mx, float* sums, cudaStream_t s);
void ce_finish(const float* mx, const float* sums, int64_t rows, float* lse, float* loss, cudaStream_t s);
void ce_backward(const float* dloss, const float* logits, const void* targets, bool t64, const float* lse,
                 float* dlogits, int64_t rows, int64_t V, int64_t vocab_start, cudaStream_t s);

// Multi-tensor AdamW: up to kAdamTensors tensors per launch. Moments f32, or bf16 where m_bf16 / v_bf16 (every
// tensor of the batch alike).
constexpr int kAdamTensors = 24;
struct AdamWBatch {
  float* p[kAdamTensors];
  const float* g[kAdamTensors];
  void* m[kAdamTensors];
  void* v[kAdamTensors];
  void* p_bf16[kAdamTensors] = {};  // null, or the updated parameter rounded to bf16 (nn::Parameter stored in bf16)
  int64_t n[kAdamTensors];
  int count = 0;
  bool m_bf16 = false, v_bf16 = false;
};
struct AdamWScalars {
  float lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};
void adamw(const AdamWBatch& batch, const AdamWScalars& hp, cudaStream_t s);
// SGD with momentum (optim/sgd.h): d = g·grad_scale + wd·p, buf = momentum·buf + d, p = p − lr·buf, each operation
// rounded on its own as the CPU computes it (no fused multiply-add): the CPU's bits.
void sgd(float* p, const float* g, float* buf, int64_t n, float lr, float wd, float momentum, float grad_scale,
         cudaStream_t s);
// The entries of a[0, n) equal to zero (−0 too) into *out_device; integer sums, exact.
void count_zeros(const float* a, int64_t n, int64_t* out_device, cudaStream_t s);

// Causal GQA attention, FlashAttention-2 style (online softmax, lse kept, recomputation in the backward),
// q/o [S, B, Nq, D], k/v [S, B, Nkv, D], lse [B, Nq, S], all f32 in memory. round_bf16: q, k, v, P and dS are
// rounded to bf16 where the CPU bf16 kernel rounds them. D ≤ 256. Deterministic: dK/dV and dQ each have one owner.
// drop (on or not): attention dropout as kernels/attention.h's AttentionDropout, O = (P ⊙ Z)·V with the CPU's keep
// bits (attention_dropout.cuh); lse stays the undropped softmax's, and backward regenerates Z.
void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S, int64_t B,
                       int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16, const DropoutParams& drop,
                       cudaStream_t s);
// dkv_scratch: launch_attention_tc.h's attention_tc_dkv_part_floats(...) floats where the tensor-core path applies
// (the partial dK/dV of split query heads; null when that is 0).
void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, float* dq, float* dk, float* dv, float* delta_scratch, float* dkv_scratch,
                        int64_t S, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                        const DropoutParams& drop, cudaStream_t s);

}  // namespace moecore::launch
