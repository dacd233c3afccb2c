// Pointer-level launchers of the MoE router kernels (routing.cu): CUDA headers only, like launch.h. The Tensor-level
// caller is kernels/cuda/routing.cpp. Everything is f32 (the GPU router refuses f64) but Sinkhorn's
// balanced cost (f64), ids I32, counts and sums f64. Every launcher queues work on `s` and returns; none uses
// floating-point atomics, so reruns give the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

// The per-token work of the router forward, fused in one kernel (one thread per token, the CPU router's loops in
// the same order): scores, (group-limited, expert-biased) top-k with ties to the lower index, probabilities and
// the scaling factor; when training, also the aux scores with their plain top-k, the entropy term and the
// logsumexp for the z-loss.
struct RouterRowArgs {
  int64_t T = 0, E = 0, K = 0;
  bool sigmoid = false;      // score function: sigmoid, else softmax
  bool pre_softmax = false;  // softmax over E before the top-k
  int64_t num_groups = 0;    // group-limited top-k when group_topk > 0
  int64_t group_topk = 0;
  float scale = 1.0f;                // --moe-router-topk-scaling-factor (1 when none)
  const float* used = nullptr;       // [T, E] logits routed on
  const float* bias = nullptr;       // [E] expert bias (selection only) or null
  const double* sinkhorn = nullptr;  // [T, E] Sinkhorn's balanced cost (training): the experts are its top-k
  float* scores = nullptr;           // [T, E] softmax / sigmoid scores (sigmoid or pre-softmax), else null
  int32_t* idx = nullptr;            // [T, K] selected experts, selection order
  float* p = nullptr;                // [T, K] probabilities before the scaling factor
  float* probs = nullptr;            // [T, K] p · scale
  int32_t* kept = nullptr;           // [T, K] set to 1
  float* group_scores = nullptr;     // [T, G] scratch (group-limited only)
  int32_t* group_sel = nullptr;      // [T, G] scratch (group-limited only)
  // Training only (null otherwise).
  float* aux_scores = nullptr;    // [T, E] softmax, or sigmoid normalised over E
  int32_t* aux_top = nullptr;     // [T, K] plain top-k of the aux scores (null: not computed)
  double* entropy_T = nullptr;    // [T] −Σ_e a·log a (f64)
  const float* logits = nullptr;  // [T, E] the real logits, for the z-loss (null: no z-loss)
  float* lse = nullptr;           // [T]
  double* lse_sq_T = nullptr;     // [T] lse² (f64)
};
void router_rows(const RouterRowArgs& a, cudaStream_t s);

// Capacity dropping (reference §1.2), one block per expert: the expert's assignments in token order, each kept or
// dropped by the CPU router's rule (probs: the C largest, ties to the earlier token, zero ones after the positive
// ones in token order, or under padding among every token without a positive assignment; position: the first C).
// Dropped ones get kept = 0 and probs = 0. Scratch: list_ET and work_ET, E·T I32 each.
void router_capacity(const int32_t* idx, float* probs, int32_t* kept, int64_t T, int64_t E, int64_t K, int64_t C,
                     bool by_position, bool pad, int32_t* list_ET, int32_t* work_ET, cudaStream_t s);

// ids_out[i] = kept[i] ? idx[i] : −1.
void router_mask_ids(const int32_t* idx, const int32_t* kept, int32_t* ids_out, int64_t n, cudaStream_t s);

// counts_E[e] = #{i : ids[i] = e} over n ids (−1 never counts), as f64.
void router_expert_counts(const int32_t* ids, int64_t n, int64_t E, double* counts_E, cudaStream_t s);

// For the load-balancing losses: tokens fall into G classes (t mod G: G = B sequences for seq_aux_loss, 1 for the
// batch-wide losses). cnt[g·E + e] = Σ_{t≡g} Σ_j [top[t, j] = e] and agg[g·E + e] = Σ_{t≡g} a[t, e], f64,
// one block per (g, e) over a fixed tree.
void router_aux_counts(const float* a, const int32_t* top, int64_t T, int64_t E, int64_t K, int64_t G, double* cnt,
                       double* agg, cudaStream_t s);
// d[t, e] += coef[(t mod G)·E + e].
void router_add_class_coef(float* d, const float* coef, int64_t T, int64_t E, int64_t G, cudaStream_t s);

// out[0] = Σ v (f64, one block, fixed tree).
void router_sum_f64(const double* v, int64_t n, double* out, cudaStream_t s);

// a[i] *= u[i] (the jitter on the gating input, and on its gradient).
void router_mul(float* a, const float* u, int64_t n, cudaStream_t s);

// Backward of the per-token score function into dl [T, E] (overwritten): softmax over the selected, softmax over E
// (pre-softmax) or sigmoid (renormalised when K > 1); dropped assignments carry no gradient. scores: as forward.
void router_score_backward(const float* dP, const int32_t* idx, const int32_t* kept, const float* p,
                           const float* scores, bool sigmoid, bool pre_softmax, float scale, int64_t T, int64_t E,
                           int64_t K, float* dl, cudaStream_t s);
// dl += scale · d(aux scores)/d(logits)ᵀ · da (softmax, or sigmoid normalised over E on `used`).
void router_aux_score_backward(bool sigmoid, const float* used, const float* a, const float* da, float* dl, int64_t T,
                               int64_t E, float scale, cudaStream_t s);
// dl[t, e] += f · lse[t] · exp(l[t, e] − lse[t]).
void router_z_loss_backward(const float* logits, const float* lse, float f, int64_t T, int64_t E, float* dl,
                            cudaStream_t s);

}  // namespace moecore::launch
