// ChainedOptimizer (see chained_optimizer.h).
#include "moecore/optim/chained_optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "moecore/core/timers.h"
#include "moecore/kernels/backend.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/optim/adamw.h"
#include "moecore/optim/distributed_optimizer.h"

namespace moecore::optim {

namespace {
// Replicated state: the whole gradient all-reduced in buckets, then AdamW on every element.
class ReplicatedAdamW : public ParamClassOptimizer {
 public:
  ReplicatedAdamW(std::vector<nn::Parameter*> params, size_t num_buckets, const BucketOf& bucket_of,
                  const comm::ProcessGroup* group, std::vector<double> norm_weights, ElementRule rule,
                  int64_t bucket_size, GradPrecision precision, double scale)
      : adam_(params, rule),
        buckets_(params, num_buckets, bucket_of, group, bucket_size, precision, scale),
        weights_(std::move(norm_weights)) {}
  const std::vector<nn::Parameter*>& params() const override { return adam_.params(); }
  size_t start_bucket(size_t b) override { return buckets_.start(b); }
  void reduce_gradients(double scale, float unscale, kernels::ClipState& clip) override {
    buckets_.finish(scale);
    grads_.clear();
    for (auto* p : params()) grads_.push_back(p->grad);
    if (unscale != 1.0f)
      for (Tensor& g : grads_) kernels::scale_(g, unscale);
    kernels::squares_add_part(clip, grads_, weights_);
  }
  double zero_share() const override {
    double z = 0;
    for (size_t i = 0; i < params().size(); i++)
      z += weights_[i] * static_cast<double>(kernels::count_zeros(params()[i]->grad));
    return z;
  }
  void step(const kernels::AdamWParams& hp, int64_t step) override { adam_.step(hp, step); }
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const override {
    m = adam_.exp_avg();
    v = adam_.exp_avg_sq();
  }
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) override { adam_.load_moments(m, v); }
  void gather_master(std::vector<Tensor>& w) const override { adam_.gather_master(w); }
  void load_master(const std::vector<Tensor>& w) override { adam_.load_master(w); }
  std::vector<double> master_squares() const override {
    std::vector<double> sq;
    for (size_t i = 0; i < params().size(); i++) sq.push_back(kernels::sum_squares(adam_.master(i)));
    return sq;
  }

 private:
  AdamW adam_;
  GradBuckets buckets_;
  std::vector<double> weights_;
  std::vector<Tensor> grads_;  // the norm's terms (handles), reused every step
};
}  // namespace

ChainedOptimizer::ChainedOptimizer(const std::vector<nn::Parameter*>& params, size_t num_buckets,
                                   const BucketOf& bucket_of, const OptimizerGroups& groups, const OptimizerConfig& cfg)
    : params_(params),
      g_(groups),
      scaler_(cfg.scaler),
      cfg_(cfg),
      dp_size_(static_cast<double>(g_.dp ? g_.dp->size() : 1)),
      num_buckets_(num_buckets),
      sp_(params, num_buckets, bucket_of, g_.tp && g_.tp->size() > 1 ? g_.tp : nullptr, cfg.grad_precision.main) {
  MOE_ASSERT_MSG(!cfg_.grad_precision.low() || !cfg_.muon, "Muon with low-precision main gradients");
  by_bucket_.resize(std::max<size_t>(num_buckets, 1));
  for (size_t i = 0; i < params_.size(); i++) {
    index_[params_[i]] = i;
    by_bucket_.at(bucket_of ? bucket_of(*params_[i]) : by_bucket_.size() - 1).push_back(params_[i]);
  }
  clip_ = kernels::make_clip_state(params.empty() ? Device::cpu() : params.front()->value.device(),
                                   std::max<int64_t>(1, cfg_.deferred_norms));
  std::vector<nn::Parameter*> dense, expert, decoupled;
  for (auto* p : params) {
    const bool emb_out = p->name.rfind("embedding.", 0) == 0 || p->name.rfind("output_layer.", 0) == 0;
    (p->expert_parallel ? expert : cfg_.decoupled && emb_out ? decoupled : dense).push_back(p);
  }
  for (auto* part : {&dense, &expert, &decoupled}) {
    if (part->empty()) continue;
    const bool is_expert = part == &expert;
    const comm::ProcessGroup* group = is_expert ? g_.edp : g_.dp;
    if (cfg_.muon) {  // Muon for the matrices; the rest stays in `part` for AdamW
      std::vector<nn::Parameter*> mats, rest;
      std::vector<double> w;
      for (auto* p : *part) {
        (is_muon_matrix(*p) ? mats : rest).push_back(p);
        if (is_muon_matrix(*p)) w.push_back(norm_weight(*p));
      }
      if (!mats.empty())
        parts_.push_back(std::make_unique<Muon>(mats, num_buckets, bucket_of, group, is_expert ? g_.etp : g_.tp,
                                                std::move(w), cfg_.muon_cfg, cfg_.distributed, cfg_.bucket_size));
      *part = rest;
      if (part->empty()) {
        decoupled_part_.resize(parts_.size(), false);
        continue;
      }
    }
    if (distributed() && cfg_.sharding != Sharding::NoShard) {
      const comm::ProcessGroup *shard_group = group, *inter = nullptr;
      if (cfg_.instances > 1) {  // Megatron's partial distributed optimizer
        const int64_t n = group->size() / cfg_.instances;
        MOE_CHECK(n * cfg_.instances == group->size(),
                  "--num-distributed-optimizer-instances {} must divide the {} size {}", cfg_.instances,
                  is_expert ? "expert-data-parallel" : "data-parallel", group->size());
        comm::RankGroups intra(static_cast<size_t>(cfg_.instances)), across(static_cast<size_t>(n));
        for (int64_t r = 0; r < group->size(); r++) {
          intra[static_cast<size_t>(r / n)].push_back(r);
          across[static_cast<size_t>(r % n)].push_back(r);
        }
        instance_groups_.push_back(std::make_unique<comm::ProcessGroup>(group->split(intra)));
        shard_group = instance_groups_.back().get();
        instance_groups_.push_back(std::make_unique<comm::ProcessGroup>(group->split(across)));
        inter = instance_groups_.back().get();
      }
      // Shards count their elements once per shard group: the weight is scaled back by its size.
      const double shards = static_cast<double>(shard_group->size());
      auto weight = [this, shards](const nn::Parameter& p) { return norm_weight(p) * shards; };
      const bool units = cfg_.sharding != Sharding::Optim;  // Megatron FSDP's: one bucket per layer bucket
      parts_.push_back(std::make_unique<ShardedAdamW>(
          *part, *shard_group, weight, bucket_of, cfg_.rule, inter, num_buckets - 1, units ? 0 : cfg_.bucket_size,
          FsdpOptions{cfg_.sharding, cfg_.fsdp_double_buffer, cfg_.fsdp_init_shards, cfg_.init_seed,
                      cfg_.fsdp_outer_shard, cfg_.grad_precision, 1.0 / dp_size_}));
      if (cfg_.overlap_param_gather)
        static_cast<ShardedAdamW&>(*parts_.back()).overlap_param_gather(cfg_.param_gather_with_step);
    } else {
      std::vector<double> w;
      for (auto* p : *part) w.push_back(norm_weight(*p));
      parts_.push_back(std::make_unique<ReplicatedAdamW>(*part, num_buckets, bucket_of, group, std::move(w), cfg_.rule,
                                                         cfg_.bucket_size, cfg_.grad_precision, 1.0 / dp_size_));
    }
    decoupled_part_.resize(parts_.size(), part == &decoupled);
  }
}

ChainedOptimizer::~ChainedOptimizer() = default;

double ChainedOptimizer::norm_weight(const nn::Parameter& p) const {
  if (!g_.dp) return 1.0;
  if (p.expert_parallel) return 1.0 / static_cast<double>(g_.edp->size());
  const double tp = static_cast<double>(g_.tp ? g_.tp->size() : 1);
  const double copies = &p == g_.shared_embedding && g_.embedding ? static_cast<double>(g_.embedding->size()) : 1.0;
  return 1.0 / (dp_size_ * (p.tensor_parallel ? 1.0 : tp) * copies);
}

void ChainedOptimizer::layer_grads_final(size_t bucket) {
  if (fsdp_units()) {  // every micro-batch's unit_backward_done reduced them, but the shared embedding's unit's
    if (shares_embedding(bucket)) {
      sum_shared_grads(bucket);
      for (auto& part : parts_) part->unit_backward_done(bucket);
    }
    return;
  }
  sum_shared_grads(bucket);
  if (cfg_.overlap_grad_reduce)
    for (auto& part : parts_) started_count_ += part->start_bucket(bucket);
}

void ChainedOptimizer::micro_batch_grads_done(size_t bucket) {
  if (!rounds_grads()) return;
  for (auto* p : by_bucket_.at(bucket))
    if (!p->grad_stale) round_to_dtype(p->grad, cfg_.grad_precision.main);  // a stale one counts as zero
}

void ChainedOptimizer::unit_forward(size_t bucket) {
  for (auto& part : parts_) part->unit_forward(bucket);
}

void ChainedOptimizer::unit_prefetch(size_t bucket) {
  for (auto& part : parts_) part->unit_prefetch(bucket);
}

void ChainedOptimizer::unit_params_done(size_t bucket) {
  for (auto& part : parts_) part->unit_forward_done(bucket);
}

void ChainedOptimizer::unit_backward(size_t bucket) {
  for (auto& part : parts_) part->unit_backward(bucket);
}

bool ChainedOptimizer::shares_embedding(size_t bucket) const {
  return bucket + 1 == num_buckets_ && g_.embedding && g_.shared_embedding && g_.embedding->size() > 1;
}

void ChainedOptimizer::sum_shared_grads(size_t bucket) {
  // Megatron's _allreduce_word_embedding_grads: the first and last stage's word-embedding gradients summed, so
  // both copies take the same update (a sum, so it commutes with the data-parallel reduction that follows).
  if (shares_embedding(bucket)) {
    nn::Parameter& e = const_cast<nn::Parameter&>(*g_.shared_embedding);
    e.settle_grad();
    if (cfg_.grad_precision.main != DType::F32)  // Megatron sums the main_grad copies, in their dtype
      low_precision_all_reduce(*g_.embedding, e.grad, cfg_.grad_precision.main, 1.0);
    else
      g_.embedding->all_reduce(e.grad);
  }
  sp_.sum(bucket);
}

void ChainedOptimizer::unit_backward_done(size_t bucket) {
  if (!fsdp_units()) return;
  // The word embedding shared by the first and last pipeline stage: its unit's whole gradients stay for the step
  // and are summed over the embedding group once, after the schedule (layer_grads_final), as without FSDP (a
  // stage summing them here would wait for the other while it waits for this one's activation gradients).
  if (shares_embedding(bucket)) {
    for (auto& part : parts_) part->unit_forward_done(bucket);
    return;
  }
  // As layer_grads_final does for the last micro-batch without FSDP: the sums come before the data-parallel
  // reduction (each is a sum, so summing every micro-batch's commutes with the accumulation into the shard).
  sum_shared_grads(bucket);
  for (auto& part : parts_) part->unit_backward_done(bucket);
}

size_t ChainedOptimizer::buckets_gathered() const {
  size_t n = 0;
  for (const auto& part : parts_) n += part->buckets_gathered();
  return n;
}

size_t ChainedOptimizer::grad_buckets_live() const {
  size_t n = 0;
  for (const auto& part : parts_) n += part->grad_buckets_live();
  return n;
}

size_t ChainedOptimizer::param_gathers_pending() const {
  size_t n = 0;
  for (const auto& part : parts_) n += part->param_gathers_pending();
  return n;
}

void ChainedOptimizer::wait_param_gather(size_t bucket) {
  for (auto& part : parts_) part->wait_param_gather(bucket);
}

void ChainedOptimizer::finish_param_gather() {
  for (auto& part : parts_) part->finish_param_gather();
}

std::optional<double> ChainedOptimizer::finish_gradients(std::span<double> riders, int64_t iteration) {
  // Dense and expert gradients are both scaled by 1/DP, Megatron's 1/(DP·CP). Each part adds its share of the
  // squared norm where the gradients are (one part after the other, as the host summed them).
  double zeros = 0;
  kernels::squares_reset(clip_);
  started_in_backward_ = std::exchange(started_count_, 0);
  MOE_ASSERT_MSG(!scaler_.active() || kernels::backend_offers(clip_.device()).norm_on_host,
                 "loss scaling reads the gradient norm on the host");
  const float unscale = scaler_.active() ? scaler_.inv_scale() : 1.0f;
  {
    TimerScope timer("all-grads-sync", 1);  // Megatron's level-1 timers (core/timers.h)
    for (auto& part : parts_) {
      part->reduce_gradients(1.0 / dp_size_, unscale, clip_);
      if (cfg_.count_zeros) zeros += part->zero_share();
    }
  }
  std::optional<double> world_sq;
  if (g_.world) {
    TimerScope timer("optimizer-clip-main-grad", 1);  // the global norm the clipping divides by
    Tensor u = Tensor::empty({static_cast<int64_t>(riders.size()) + 2}, DType::F64);
    u.set_item(0, kernels::squares_total(clip_));  // host-staged: the sum over ranks goes through the host
    u.set_item(1, zeros);
    for (size_t i = 0; i < riders.size(); i++) u.set_item(static_cast<int64_t>(i) + 2, riders[i]);
    g_.world->all_reduce(u);
    world_sq = u.item(0);
    zeros = u.item(1);
    for (size_t i = 0; i < riders.size(); i++) riders[i] = u.item(static_cast<int64_t>(i) + 2);
  }
  num_zeros_ = std::llround(zeros);
  // The norm, the clip coefficient and the non-finite check where the gradients are; the norm kept for the host's
  // log where nothing brought it to the host.
  const bool on_host = world_sq.has_value() || kernels::backend_offers(clip_.device()).norm_on_host;
  kernels::clip_finish(clip_, world_sq, cfg_.clip_grad, cfg_.check_finite, iteration, !on_host);
  const std::optional<double> norm =
      world_sq ? std::optional<double>(std::sqrt(*world_sq)) : kernels::norm_on_host(clip_);
  // Megatron's found_inf (its MAX over the ranks: here the world's sum of squares, finite only where every rank's
  // gradients are), then the scaler's update.
  found_inf_ = scaler_.active() && !std::isfinite(*norm);
  if (scaler_.active()) scaler_.update(found_inf_);
  return norm;
}

void ChainedOptimizer::step(double lr, int64_t iteration, double decoupled_lr) {
  kernels::AdamWParams hp = cfg_.adam;
  hp.lr = lr;
  // Global-norm clipping, applied by the optimizer as it reads each gradient: the coefficient (clip / (norm +
  // 1e-6) where below 1) from the clip state, read by the GPU's kernels from device memory.
  TimerScope timer("optimizer-inner-step", 1);  // with the distributed optimizer's params-all-gather inside
  if (found_inf_) return;                       // a skipped step: Megatron's optimizer.step returns False
  for (size_t i = 0; i < parts_.size(); i++) {
    kernels::AdamWParams h = hp;
    if (!kernels::apply_clip(clip_, h, parts_[i]->host_clip())) continue;  // a skipped step (known on the host)
    if (decoupled_part_[i]) {
      MOE_ASSERT_MSG(decoupled_lr >= 0, "the decoupled parameters need --decoupled-lr's rate");
      h.lr = decoupled_lr;
    }
    parts_[i]->step(h, iteration);
  }
}

void ChainedOptimizer::gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const {
  m.assign(params_.size(), Tensor());
  v.assign(params_.size(), Tensor());
  for (const auto& part : parts_) {
    std::vector<Tensor> pm, pv;
    part->gather_moments(pm, pv);
    for (size_t i = 0; i < pm.size(); i++) {
      m[index_.at(part->params()[i])] = pm[i];
      v[index_.at(part->params()[i])] = pv[i];
    }
  }
}

void ChainedOptimizer::load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) {
  for (auto& part : parts_) {
    std::vector<Tensor> pm, pv;
    for (auto* p : part->params()) {
      pm.push_back(m[index_.at(p)]);
      pv.push_back(v[index_.at(p)]);
    }
    part->load_moments(pm, pv);
  }
}

void ChainedOptimizer::gather_master(std::vector<Tensor>& w) const {
  w.assign(params_.size(), Tensor());
  for (const auto& part : parts_) {
    std::vector<Tensor> pw;
    part->gather_master(pw);
    for (size_t i = 0; i < pw.size(); i++) w[index_.at(part->params()[i])] = pw[i];
  }
}

double ChainedOptimizer::master_sum_squares(const std::function<double(const nn::Parameter&)>& weight) const {
  std::vector<double> per(params_.size(), 0.0);
  for (const auto& part : parts_) {
    const std::vector<double> sq = part->master_squares();
    for (size_t i = 0; i < sq.size(); i++) per[index_.at(part->params()[i])] = sq[i];
  }
  double sum = 0;  // in registry order
  for (size_t i = 0; i < params_.size(); i++) sum += weight(*params_[i]) * per[i];
  return sum;
}

std::vector<HeldValues> ChainedOptimizer::held_values() const {
  std::vector<HeldValues> held;
  for (const auto& part : parts_) {
    std::vector<HeldValues> h = part->held_values();
    held.insert(held.end(), h.begin(), h.end());
  }
  return held;
}

void ChainedOptimizer::load_master(const std::vector<Tensor>& w) {
  MOE_ASSERT(w.size() == params_.size());
  for (auto& part : parts_) {
    std::vector<Tensor> pw;
    for (auto* p : part->params()) pw.push_back(w[index_.at(p)]);
    part->load_master(pw);
  }
}

}  // namespace moecore::optim
