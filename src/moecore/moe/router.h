// TopKRouter with Megatron-Core's semantics (reference §1.1, §1.2): gating linear → score function → top-k (group
// limited, expert-bias selection) → capacity dropping, emitting [T, K] ids and probabilities for the dispatcher;
// load-balancing losses and z-loss (aux_losses.h) enter backward as "identity forward, scaled gradient" on the
// logits, never through the LM loss. The router owns the expert-bias counters and the routing statistics, both
// closed once per global batch by finish_global_batch(). Logits, scores and losses are computed in the router dtype
// (f32 or f64) whatever the activations. Under sequence (and context) parallelism each rank routes its own tokens; the
// aux-loss counts are summed over the TP×CP group and the token totals count all of its ranks, so the losses summed
// over the group are the single-rank losses (reference §1.1b).
#pragma once

#include <string>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/routing.h"
#include "moecore/moe/aux_losses.h"
#include "moecore/moe/routed_tokens.h"
#include "moecore/nn/parameter.h"
#include "moecore/nn/routing_stats.h"

namespace moecore::moe {

enum class ScoreFunction { Softmax, Sigmoid };
enum class LoadBalancingType { AuxLoss, SeqAuxLoss, GlobalAuxLoss, Sinkhorn, None };
enum class DropPolicy { Probs, Position };

ScoreFunction parse_score_function(const std::string& s);
LoadBalancingType parse_load_balancing_type(const std::string& s);
DropPolicy parse_drop_policy(const std::string& s);
const char* load_balancing_name(LoadBalancingType t);

struct RouterConfig {
  int64_t hidden = 0;
  int64_t num_experts = 0;  // E
  int64_t topk = 2;         // K
  ScoreFunction score_function = ScoreFunction::Softmax;
  bool pre_softmax = false;
  double topk_scaling_factor = 0.0;  // 0: none
  int64_t num_groups = 0;            // 0: no group-limited routing
  int64_t group_topk = 0;
  bool enable_expert_bias = false;
  double bias_update_rate = 1e-3;
  std::vector<LoadBalancingType> load_balancing{LoadBalancingType::AuxLoss};
  std::vector<double> aux_loss_coeff{0.0};  // one per load-balancing type
  double z_loss_coeff = 0.0;
  double input_jitter_eps = 0.0;
  bool force_load_balancing = false;
  DType router_dtype = DType::F32;  // F32 or F64
  double capacity_factor = -1.0;    // < 0: dropless
  DropPolicy drop_policy = DropPolicy::Probs;
  bool pad_to_capacity = false;
  double init_std = 0.02;
  // --add-bias-linear (Megatron's default): a gating bias b [E], logits = x·Wᵀ + b, drawn like the weight (Megatron's
  // Router.reset_parameters applies init_method to both).
  bool bias = false;
  uint64_t seed = 1234;                             // jitter and forced-balance noise streams
  const comm::ProcessGroup* count_group = nullptr;  // TP×CP (null: this rank's tokens are the whole set)
  // global_aux_loss: counts summed over TP×DP×CP; each rank's share of the loss is the global batch's loss over
  // its tokens, its gradient multiplied by DP so that data-parallel gradient averaging leaves the global loss's
  // gradient (Megatron's 1/DP weakening, upstream issue #3672, is not reproduced).
  const comm::ProcessGroup* global_group = nullptr;
  double global_grad_scale = 1.0;
};

// Megatron's sinkhorn routing (sinkhorn.h) is the one type given: it fixes the activation (sigmoid for top-1,
// softmax over all experts otherwise, the selected values unnormalised); the Router routes with that.
bool routes_by_sinkhorn(const RouterConfig& c);

// Rejects inconsistent settings with Megatron's flag names in the message. Called before anything is allocated.
// Any expert and group count that fits the I32 expert ids is supported (scratch is sized from the config).
void validate(const RouterConfig& c);

// Capacity per expert for T local tokens: ceil(K·T/E · CF).
int64_t expert_capacity(const RouterConfig& c, int64_t T);

class Router {
 public:
  struct Stash {
    int64_t S = 0, B = 0;       // token t = s·B + b
    Tensor x_r;                 // gating input [T, H] in router dtype (jittered), or as kept_TH gave it
    Tensor jitter_TH;           // multiplicative jitter (router dtype) or undefined
    Tensor logits_TE;           // gating output
    Tensor used_TE;             // logits routed on: logits_TE, or N(0,1) noise under forced balance
    Tensor scores_TE;           // softmax over E (pre-softmax) or sigmoid, for backward
    Tensor idx_TK;              // I32 selected experts, in selection order (dropped ones included)
    Tensor p_TK;                // normalized selected probs, before the scaling factor
    Tensor kept_TK;             // I32: 1 where the assignment survived capacity dropping
    Tensor daux_TE;             // Σ over aux-loss types of dL/d(aux score), or undefined
    Tensor aux_scores_TE;       // aux scores (softmax, or sigmoid normalized over E)
    Tensor lse_T;               // logsumexp of the logits, for the z-loss
    double aux_loss_total = 0;  // Σ over types of L (coefficients included) + z-loss, this micro-batch
    // What a recompute's replay of this forward needs (nn/recompute.h), kept when the rest is dropped: the noise
    // streams' position and the global-aux counts as they stood before this forward.
    struct Replay {
      uint64_t forward_index = 0;
      GlobalAuxCounts global_before;
    } replay;
    // Set by the caller: this forward replays the one recorded in `replay`; it counts and accumulates nothing.
    bool recompute = false;
  };

  using Output = RoutedTokens;

  Router(nn::ParamRegistry& reg, const std::string& name, const RouterConfig& cfg);

  // x_TH [T, H] with T = S·B -> ids and probabilities [T, K]. Aux losses, expert-bias counts and statistics only
  // when training. With x_TH on a GPU (and the weight moved there by ParamRegistry::to) every Stash tensor and the
  // output live on that GPU (router.cpp says what still passes through the host: the noise draws and [E]-sized
  // counts); the expert bias moves there on the first GPU forward, the expert-bias counts stay on the host.
  // kept_TH (--bf16): x_TH rounded to bf16, what the stash keeps of the gating input for the weight gradient (read
  // widened to the router dtype) where that input is x_TH itself or its router-dtype copy (no jitter), as Megatron's
  // router keeps its bf16 input; the logits and everything after them stay in the router dtype.
  Output forward(const Tensor& x_TH, int64_t S, int64_t B, bool training, Stash& st, const Tensor* kept_TH = nullptr);
  // dprobs_TK [T, K] (router dtype; dropped assignments carry none) -> dx_TH [T, H] in x's dtype; adds
  // aux_grad_scale · d(aux + z)/dx.
  // dx_add: the input gradient is added to *dx_add ([T, H] of x_dtype) and nothing is returned — on the CPU in the
  // router's dtype without jitter by the gating GEMM itself, with no pass of its own.
  Tensor backward(const Tensor& dprobs_TK, DType x_dtype, double aux_grad_scale, Stash& st, Tensor* dx_add = nullptr);

  // Once per global batch, after gradients are final: the expert-bias counts are summed over global_group
  // (TP×DP×CP), b_e += rate · sign(mean(c) − c_e); the batch's statistics become last_global_batch(); counters,
  // statistics and the global-aux accumulators are reset.
  void finish_global_batch();
  // Clears the balancing counters and global-aux accumulators without touching the bias or the statistics.
  void reset_counters();

  // Statistics of the global batch in progress (this rank's tokens, training forwards only).
  const nn::RoutingStats& stats() const { return stats_; }
  // Statistics of the last finished global batch: what logging reads.
  const nn::RoutingStats& last_global_batch() const { return last_stats_; }

  const RouterConfig& config() const { return cfg_; }
  Tensor& expert_bias() { return expert_bias_E_; }
  Tensor& local_tokens_per_expert() { return tokens_per_expert_E_; }
  nn::Parameter& weight() { return *weight_; }
  nn::Parameter* gating_bias() { return bias_; }  // null without --add-bias-linear
  // Training forwards so far: the position of the jitter and forced-balance noise streams (checkpointed).
  uint64_t& forward_count() { return forward_count_; }

 private:
  int64_t count_ranks() const { return cfg_.count_group ? cfg_.count_group->size() : 1; }
  double add_aux_losses(const Tensor& top_TK, int64_t S, int64_t B, bool count, Stash& st);
  // The noise streams (router_noise.cpp), drawn on the host for either device: this forward's position in them
  // (advanced by a training forward, the recorded one for a replay) and this rank's first global token; the jitter
  // multipliers U(1−ε, 1+ε) [T, H] and the forced-balance logits N(0, 1) [T, E], in router dtype.
  struct NoisePosition {
    uint64_t forward = 0, first_token = 0;
  };
  NoisePosition noise_position(int64_t T, bool training, const Stash& st);
  Tensor jitter_multipliers(int64_t T, const NoisePosition& n) const;
  Tensor balance_noise(int64_t T, const NoisePosition& n) const;
  // The gating linear's forward (st.logits_TE from st.x_r) and its parameters' gradients from dlogits, for both
  // devices (router_gating.cpp); the input gradient dl·W stays with each device's backward.
  void gating_forward(Stash& st) const;
  void gating_param_grads(const Tensor& dl_TE, const Stash& st);
  RouterConfig cfg_;
  kernels::RouterRule rule_;  // the per-token rule of cfg_
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;  // [E], with cfg_.bias
  Tensor expert_bias_E_;           // f32, used for selection only (on the GPU after a GPU forward)
  Tensor tokens_per_expert_E_;     // f64 counts since the last global batch (expert-bias update)
  GlobalAuxCounts global_aux_;     // global_aux_loss counts accumulated over micro-batches
  uint64_t forward_count_ = 0;     // advances the jitter / forced-balance noise streams
  uint64_t jitter_stream_ = 0, balance_stream_ = 0;
  nn::RoutingStats stats_, last_stats_;
};

}  // namespace moecore::moe
