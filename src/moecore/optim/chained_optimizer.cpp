// ChainedOptimizer (see chained_optimizer.h).
#include "moecore/optim/chained_optimizer.h"

#include <cmath>
#include <map>

#include "moecore/kernels/cpu/elementwise.h"
#include "moecore/optim/adamw.h"
#include "moecore/optim/distributed_optimizer.h"

namespace moecore::optim {

namespace {
// Replicated state: the whole gradient all-reduced in buckets, then AdamW on every element.
class ReplicatedAdamW : public ParamClassOptimizer {
 public:
  ReplicatedAdamW(std::vector<nn::Parameter*> params, size_t num_buckets, const BucketOf& bucket_of,
                  const comm::ProcessGroup* group, std::vector<double> norm_weights)
      : adam_(params), buckets_(params, num_buckets, bucket_of, group), weights_(std::move(norm_weights)) {}
  const std::vector<nn::Parameter*>& params() const override { return adam_.params(); }
  void start_bucket(size_t b) override { buckets_.start(b); }
  double reduce_gradients(double scale) override {
    buckets_.finish(scale);
    double sq = 0;
    for (size_t i = 0; i < params().size(); i++) sq += weights_[i] * kernels::sum_squares(params()[i]->grad);
    return sq;
  }
  void step(const kernels::AdamWParams& hp, int64_t step) override { adam_.step(hp, step); }
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const override {
    m = adam_.exp_avg();
    v = adam_.exp_avg_sq();
  }
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) override {
    adam_.exp_avg() = m;
    adam_.exp_avg_sq() = v;
  }
  void refresh_master() override {}

 private:
  AdamW adam_;
  GradBuckets buckets_;
  std::vector<double> weights_;
};
}  // namespace

ChainedOptimizer::ChainedOptimizer(const std::vector<nn::Parameter*>& params, size_t num_buckets,
                                   const BucketOf& bucket_of, const OptimizerGroups& groups, const OptimizerConfig& cfg)
    : params_(params),
      g_(groups),
      cfg_(cfg),
      dp_size_(static_cast<double>(g_.dp ? g_.dp->size() : 1)),
      sp_(params, num_buckets, bucket_of, g_.tp && g_.tp->size() > 1 ? g_.tp : nullptr) {
  for (size_t i = 0; i < params_.size(); i++) index_[params_[i]] = i;
  std::vector<nn::Parameter*> dense, expert;
  for (auto* p : params) (p->expert_parallel ? expert : dense).push_back(p);
  const double edp = static_cast<double>(g_.edp ? g_.edp->size() : 1);
  for (auto* part : {&dense, &expert}) {
    if (part->empty()) continue;
    const bool is_expert = part == &expert;
    const comm::ProcessGroup* group = is_expert ? g_.edp : g_.dp;
    if (distributed()) {
      // Shards count their elements once per group: the weight is scaled back by the group size.
      auto weight = [this, is_expert, edp](const nn::Parameter& p) {
        return norm_weight(p) * (is_expert ? edp : dp_size_);
      };
      parts_.push_back(std::make_unique<ShardedAdamW>(*part, *group, weight, bucket_of));
    } else {
      std::vector<double> w;
      for (auto* p : *part) w.push_back(norm_weight(*p));
      parts_.push_back(std::make_unique<ReplicatedAdamW>(*part, num_buckets, bucket_of, group, std::move(w)));
    }
  }
}

ChainedOptimizer::~ChainedOptimizer() = default;

double ChainedOptimizer::norm_weight(const nn::Parameter& p) const {
  if (!g_.dp) return 1.0;
  if (p.expert_parallel) return 1.0 / static_cast<double>(g_.edp->size());
  const double tp = static_cast<double>(g_.tp ? g_.tp->size() : 1);
  return 1.0 / (dp_size_ * (p.tensor_parallel ? 1.0 : tp));
}

void ChainedOptimizer::layer_grads_final(size_t bucket) {
  sp_.sum(bucket);
  for (auto& part : parts_) part->start_bucket(bucket);
}

double ChainedOptimizer::finish_gradients(std::vector<double>& riders) {
  // Dense and expert gradients are both scaled by 1/DP, Megatron's 1/(DP·CP).
  double sq = 0;
  for (auto& part : parts_) sq += part->reduce_gradients(1.0 / dp_size_);
  if (g_.world) {
    Tensor u = Tensor::empty({static_cast<int64_t>(riders.size()) + 1}, DType::F64);
    u.set_item(0, sq);
    for (size_t i = 0; i < riders.size(); i++) u.set_item(static_cast<int64_t>(i) + 1, riders[i]);
    g_.world->all_reduce(u);
    sq = u.item(0);
    for (size_t i = 0; i < riders.size(); i++) riders[i] = u.item(static_cast<int64_t>(i) + 1);
  }
  return std::sqrt(sq);
}

void ChainedOptimizer::step(double lr, double grad_norm, int64_t iteration) {
  kernels::AdamWParams hp = cfg_.adam;
  hp.lr = lr;
  if (cfg_.clip_grad > 0) {  // global-norm clipping, applied by the optimizer as it reads each gradient
    const double coeff = cfg_.clip_grad / (grad_norm + 1e-6);
    if (coeff < 1.0) hp.grad_scale = coeff;
  }
  for (auto& part : parts_) part->step(hp, iteration);
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

void ChainedOptimizer::refresh_master() {
  for (auto& part : parts_) part->refresh_master();
}

}  // namespace moecore::optim
