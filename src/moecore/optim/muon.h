// Megatron's Muon (TensorParallelMuon over emerging_optimizers' OrthogonalizedOptimizer) for the 2-D weights of
// one parameter class: per step, on the (clipped) gradient g,
//   p ← p − lr·wd·p                        (decoupled weight decay, where the parameter has weight decay)
//   buf ← lerp(buf, g, 1 − β)               (EMA momentum, β = --muon-momentum)
//   u = nesterov ? lerp(g, buf, β) : buf   (--muon-nesterov)
//   p ← p − lr · scale(rows, cols) · extra · NS(u)
// NS is newton_schulz.h on the WHOLE matrix: a tensor-parallel shard is first assembled into its global matrix
// over `tp` (--muon-tp-mode duplicated/distributed; blockwise orthogonalises each shard alone, as Megatron does),
// so every layout gives the one-rank result. A grouped expert weight [E, rows, cols] is E matrices. Without
// --muon-no-split-qkv the q, k and v weights are separate matrices (Megatron's split of its fused linear_qkv);
// with it one layer's q, k, v stack into one. Gradients are all-reduced in buckets over `group` (grad_sync.h);
// with `layer_wise` (Megatron's layer-wise distributed optimizer: --optimizer dist_muon, or muon with
// --use-distributed-optimizer) each matrix's momentum and update live on one rank of `group`, which broadcasts
// the updated weight. A matrix the model stores in bf16 (nn::Parameter::bf16_storage) is updated on its f32 master,
// kept here (by its owner only under layer_wise), and the model's value is the master rounded.
#pragma once

#include <string>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/optim/grad_sync.h"
#include "moecore/optim/optimizer.h"

namespace moecore::optim {

struct MuonConfig {
  double momentum = 0.9;  // --muon-momentum
  bool nesterov = false;  // --muon-nesterov
  std::string scale_mode = "spectral";
  double extra_scale_factor = 1.0;
  int64_t num_ns_steps = 5;
  std::string coefficient_type = "quintic";
  bool bf16_matmul = true;  // --muon-fp32-matmul-prec medium: bf16 Newton–Schulz products
  bool split_qkv = true;
  bool blockwise = false;  // --muon-tp-mode blockwise
};

// Whether Muon takes this parameter (Megatron's is_managed_by_layer_wise_optimizer): a 2-D weight (or a grouped
// expert weight, 2-D per expert) that is not the word embedding or the output layer.
bool is_muon_matrix(const nn::Parameter& p);

class Muon : public ParamClassOptimizer {
 public:
  // `tp`: the group holding the other shards of the tensor-parallel parameters (TP, or ETP for experts); null:
  // none. `group`: the gradient all-reduce group (null: one process). `norm_weights`: as ReplicatedAdamW's.
  // `bucket_size`: --ddp-bucket-size (grad_buffer.h).
  Muon(std::vector<nn::Parameter*> params, size_t num_buckets, const BucketOf& bucket_of,
       const comm::ProcessGroup* group, const comm::ProcessGroup* tp, std::vector<double> norm_weights,
       const MuonConfig& cfg, bool layer_wise, int64_t bucket_size = 0);
  const std::vector<nn::Parameter*>& params() const override { return params_; }
  size_t start_bucket(size_t b) override { return buckets_.start(b); }
  void reduce_gradients(double scale, float unscale, kernels::ClipState& clip) override;
  double zero_share() const override;
  // hp: lr, weight_decay and grad_scale (clipping); the Adam moments are not used.
  void step(const kernels::AdamWParams& hp, int64_t step) override;
  bool host_clip() const override { return true; }  // the matrices are updated on host copies
  // m: the momentum buffers, v: zeros (checkpoints keep one format); gathered from the owners under layer_wise.
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const override;
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) override;
  // Masters of the bf16-stored matrices: from their owners under layer_wise (collective), else this rank's.
  void gather_master(std::vector<Tensor>& w) const override;
  void load_master(const std::vector<Tensor>& w) override;
  std::vector<double> master_squares() const override;

 private:
  struct Unit {                   // one orthogonalised matrix (or a stack of experts' matrices)
    std::vector<size_t> members;  // indices into params_, stacked by rows
    int64_t owner = 0;            // rank in `group` under layer_wise
  };
  bool owns(const Unit& u) const;
  // The update of each member (local shapes) → its orthogonalised, scaled update (in place).
  void orthogonalize(const Unit& u, std::vector<Tensor>& upd) const;
  std::vector<nn::Parameter*> params_;
  GradBuckets buckets_;
  const comm::ProcessGroup *group_, *tp_;
  std::vector<double> weights_;
  MuonConfig cfg_;
  bool layer_wise_;
  std::vector<Unit> units_;
  std::vector<Tensor> buf_;  // momentum per parameter (empty where another rank owns it)
  // The f32 master (on the host, where the update runs) of each matrix the model stores in bf16, on its owner.
  std::vector<Tensor> master_;
};

}  // namespace moecore::optim
