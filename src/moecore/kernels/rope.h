// Rotary position embedding on rot_dim channels of each head, starting at channel `offset`; the rest pass
// through. Two pairings: Megatron's default "rotate half" (channel i pairs with i + rot_dim/2) and the interleaved
// pairs (2i, 2i+1) that Multi-Latent Attention rotates (Megatron's mla_rotary_interleaved, HF DeepSeek-V3's
// rope_interleave: they de-interleave first and rotate halves; rotating the pairs in place gives the same numbers in
// another channel order, applied alike to queries and keys, so every dot product is unchanged). Pair i turns by
// angle position · inv_freq_i; inv_freq is plain RoPE's base^(−2i/rot_dim) or YaRN's blend (below). The tables may
// carry an amplitude (YaRN's concentration factor, Megatron's and HF's `mscale` on cos and sin): y = m·R·x.
#pragma once

#include <cmath>
#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/core/tensor.h"

namespace moecore::kernels {

// cos_SR, sin_SR: [S, rot_dim/2] for positions 0..S-1, computed in f64 and stored in `dtype`.
void rope_tables(int64_t S, int64_t rot_dim, double base, DType dtype, Tensor& cos_SR, Tensor& sin_SR);
// x_SBND [S, B, N, D] -> y_SBND (may alias x). Tables need at least S rows.
void rope_forward(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& y_SBND);
// dy_SBND -> dx_SBND (written; may alias dy).
void rope_backward(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& dx_SBND);

// YaRN ("YaRN: Efficient Context Window Extension", Megatron's YarnRotaryEmbedding, HF's _compute_yarn_parameters):
// with r_i = base^(2i/d) and the correction range [lo, hi] = [floor(c(β_fast)), ceil(c(β_slow))] clamped to
// [0, d−1], c(n) = d·ln(L₀ / (2π·n)) / (2·ln base) (L₀ the original context), the ramp
// γ_i = clamp((i − lo) / (hi − lo), 0, 1) (hi += 0.001 when equal) blends extrapolation and interpolation:
//   inv_freq_i = (1/(s·r_i))·γ_i + (1/r_i)·(1 − γ_i).
// The concentration factor on cos and sin is get_mscale(s, mscale) / get_mscale(s, mscale_all_dim) with
// get_mscale(s, m) = 0.1·m·ln(s) + 1 for s > 1, else 1.
struct YarnParams {
  double scaling_factor = 1.0;  // s (--rotary-scaling-factor)
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1.0, mscale_all_dim = 0.0;
  bool round_to_int = true;  // floor/ceil the correction range (Megatron's and HF's default)
};
double yarn_get_mscale(double scale, double mscale);
double yarn_concentration_factor(const YarnParams& y);
// inv_freq_i, i < rot_dim/2, in f64.
std::vector<double> rope_inv_freq(int64_t rot_dim, double base);
std::vector<double> yarn_inv_freq(int64_t rot_dim, double base, const YarnParams& y);
// Tables [S, inv_freq.size()] of amplitude·cos(s·inv_freq_i), amplitude·sin(...), computed in f64.
void rope_tables_from(int64_t S, const std::vector<double>& inv_freq, double amplitude, DType dtype, Tensor& cos_SR,
                      Tensor& sin_SR);

// One row of rope_forward (sign +1) or rope_backward (sign −1) in f32 with rotate-half pairs: x, y [D] (y may alias
// x: pair i reads and writes only channels i and i + h, also across vector lanes), cos and sin the row's
// h = rot_dim/2 entries; channels from 2h on are copied. rope_forward/backward turn their f32 rotate-half rows
// through it from a target-cloned loop, and so does a kernel that turns rows as it reads or writes them (the bf16
// attention kernel, attention.h AttentionRope): one inlined body whose multiply-adds are fused explicitly (std::fma),
// so no clone's contraction can differ — FlashNativeBf16Io.RopeInsideTheKernelIsRopeOutsideIt checks the bits.
// Inlined: a call per row costs more than the row.
MOE_ALWAYS_INLINE void rope_row_f32(const float* x, const float* cos, const float* sin, int64_t h, float sign,
                                    int64_t D, float* y) {
#pragma omp simd
  for (int64_t i = 0; i < h; i++) {
    const float a = x[i], b = x[i + h], si = sign * sin[i];
    y[i] = std::fma(a, cos[i], -(b * si));  // fused explicitly: the same bits in every clone and on every CPU
    y[i + h] = std::fma(b, cos[i], a * si);
  }
  for (int64_t e = 2 * h; e < D; e++) y[e] = x[e];
}

enum class RopePairs { RotateHalf, Interleaved };
// The general form: channels [offset, offset + rot_dim) of each head, paired as `pairs` says. y may alias x.
void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND);
// Backward of the above: the transposed map (sin → −sin; the amplitude stays).
void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND);

// rope_forward_at and rope_backward_at as one backend implements them (kernels/cpu/rope.cpp,
// kernels/cuda/kernels.cpp); kernels/dispatch.cpp picks the table of the rows' device.
struct RopeKernels {
  void (*forward_at)(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND);
  void (*backward_at)(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND);
};

}  // namespace moecore::kernels
