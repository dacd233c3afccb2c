// The MoE layer, the FFN of a transformer layer: shared experts (if any) → Route → Dispatch → Compute (grouped
// experts) → Combine (+ shared output). Expert parallelism lives in the dispatcher (alltoall or allgather over
// EP), expert tensor parallelism in the ETP stage around the experts; under attention tensor parallelism the layer
// takes sequence shards [S/TP, B, H], each rank routing its own tokens, and the shared experts run TP-parallel.
#pragma once

#include <memory>
#include <string>

#include "moecore/comm/process_group.h"
#include "moecore/device/side_stream.h"
#include "moecore/moe/expert_tensor_parallel.h"
#include "moecore/moe/grouped_experts.h"
#include "moecore/moe/router.h"
#include "moecore/moe/shared_experts.h"
#include "moecore/moe/token_dispatcher.h"
#include "moecore/nn/feed_forward.h"
#include "moecore/nn/substeps.h"

namespace moecore::moe {

struct MoELayerConfig {
  RouterConfig router;
  int64_t ffn_hidden = 0;              // --moe-ffn-hidden-size
  int64_t shared_ffn_hidden = 0;       // --moe-shared-expert-intermediate-size (0: none)
  bool shared_expert_gate = false;     // --moe-shared-expert-gate
  bool shared_expert_overlap = false;  // --moe-shared-expert-overlap: on a GPU, shared experts on a second stream
  // --delay-wgrad-compute (with --overlap-moe-expert-parallel-comm) or --overlap-dispatch-backward-with-experts-wgrad:
  // backward launches the dispatcher's backward all-to-all before the experts' weight-gradient GEMMs and waits for
  // it after them.
  bool overlap_dispatch_backward = false;
  kernels::Activation activation = kernels::Activation::SwiGLU;
  double init_std = 0.02;
  double output_init_std = 0.02;
  LowPrecision low{};  // --bf16 or --fp16
  // --add-bias-linear (Megatron's default): the router's gating bias and the experts' fc1 and fc2 biases (no shared
  // experts, expert tensor parallelism 1, as in Megatron).
  bool bias = false;
  // Expert parallelism: the group experts are spread over (null: all experts local).
  const comm::ProcessGroup* ep_group = nullptr;
  bool allgather_dispatcher = false;  // --moe-token-dispatcher-type allgather (else alltoall)
  bool flex_dispatcher = false;       // --moe-token-dispatcher-type flex (DeepEP/HybridEP semantics)
  // Expert tensor parallelism: the ETP group (null or one rank: experts hold all their FFN columns).
  const comm::ProcessGroup* etp_group = nullptr;
  // Context parallelism: the TP×CP group the router's aux-loss and z-loss statistics sum over (null: TP's).
  const comm::ProcessGroup* tp_cp_group = nullptr;
  // Attention tensor parallelism (with sequence parallelism): shared experts split over it, aux-loss counts
  // summed over it.
  nn::TPContext tp;
  // Selective recompute (nn/recompute.h): moe (the whole layer re-runs in backward, its all-to-all included),
  // moe_act (the experts' activation), shared_experts.
  bool recompute_moe = false, recompute_moe_act = false, recompute_shared_experts = false;
};

void validate(const MoELayerConfig& c);

class MoELayer : public nn::FeedForward {
 public:
  struct Stash : nn::FeedForward::Stash {
    Router::Stash router;
    DispatchPlan plan;
    GroupedExperts::Stash experts;
    EtpPlan etp;
    SharedExperts::Stash shared;
    int64_t S = 0, B = 0;
    Tensor x_in;                        // --recompute-modules moe: the layer's input, all the stash keeps after forward
    bool router_input_dropped = false;  // layernorm recompute: the router's input was the norm output
    bool router_input_rounded =
        false;  // the router keeps the tokens rounded to bf16 or f16 (--bf16, --fp16; no jitter)
  };

  MoELayer(nn::ParamRegistry& reg, const std::string& name, const MoELayerConfig& cfg);
  std::unique_ptr<nn::FeedForward::Stash> make_stash() const override;
  Tensor forward(const Tensor& x_SBH, nn::FeedForward::Stash& st) override;
  Tensor backward(const Tensor& dy_SBH, nn::FeedForward::Stash& st) override;
  void carry_replay(const nn::FeedForward::Stash& from, nn::FeedForward::Stash& to) const override;
  void drop_input(const Tensor& x, nn::FeedForward::Stash& st) const override;
  void restore_input(const Tensor& x, nn::FeedForward::Stash& st) const override;
  void set_training(bool training) override { training_ = training; }
  // Once per optimizer step: the router's expert-bias update and statistics snapshot (Router::finish_global_batch).
  void finish_global_batch() override { router_.finish_global_batch(); }
  const nn::RoutingStats* routing_stats() const override { return &router_.last_global_batch(); }

  Router& router() { return router_; }
  const Router& router() const { return router_; }
  GroupedExperts& experts() { return experts_; }
  // Statistics of the global batch in progress (routing_stats(): the last finished one).
  const nn::RoutingStats& stats() const { return router_.stats(); }
  // Σ of this micro-batch's aux losses (coefficients included) and z-loss: what backward differentiates.
  static double aux_loss_total(const nn::FeedForward::Stash& st) {
    return static_cast<const Stash&>(st).router.aux_loss_total;
  }

 private:
  Tensor forward_impl(const Tensor& x_SBH, Stash& st);
  // What combine_backward copies rows from (f32, or bf16 cast first: moe_layer.cpp).
  Tensor rows_input(const Tensor& x_TH) const;
  // An exchange posted (in flight) or waited, told to the combined schedule's trace (nn/substeps.h).
  bool posted(bool in_flight, nn::A2A kind) const;
  void waited(bool was_in_flight, nn::A2A kind) const;
  std::string name_;
  MoELayerConfig cfg_;
  Router router_;
  GroupedExperts experts_;
  std::unique_ptr<SharedExperts> shared_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  std::unique_ptr<ExpertTensorParallel> etp_;
  device::SideStream side_;  // --moe-shared-expert-overlap
  bool training_ = true;
};

// --moe-layer-freq: an integer N (layer i is MoE iff i % N == 0) or a list expression such as "([0]*1+[1]*3)" or
// "[1,0,1,1]". Returns one flag per layer; a list must have exactly num_layers entries.
std::vector<bool> parse_moe_layer_freq(const std::string& spec, int64_t num_layers);

}  // namespace moecore::moe
