// Routing and loss health alarms (see routing_health.h).
#include "moecore/train/observe/routing_health.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "moecore/core/error.h"

namespace moecore::train {

std::vector<LayerRouting> global_routing(const nn::GPTModel& model, const ParallelGroups& g) {
  // One slot per global layer: a mark that the layer routes, then its E counts, entropy sum and tokens. Under
  // pipeline parallelism each stage fills its own layers' slots and the sum over the pipeline group gives every
  // rank all of them, so every rank judges the same values.
  size_t E = 0, L = 0;
  for (size_t i = 0; i < model.num_layers(); i++) {
    L = std::max(L, static_cast<size_t>(model.global_layer(i)) + 1);
    if (const nn::RoutingStats* s = model.routing_stats(i)) E = std::max(E, s->tokens_per_expert.size());
  }
  const bool pipeline = g.pp && ParallelGroups::size(g.pp) > 1;
  if (pipeline) {  // the stages agree on the model's layer count and experts
    Tensor n = Tensor::empty({2}, DType::F64);
    n.set_item(0, static_cast<double>(L));
    n.set_item(1, static_cast<double>(E));
    g.pp->all_reduce(n, comm::ReduceOp::Max);
    L = static_cast<size_t>(n.item(0));
    E = static_cast<size_t>(n.item(1));
  }
  const size_t slot = E + 3;
  Tensor t = Tensor::zeros({static_cast<int64_t>(std::max<size_t>(L * slot, 1))}, DType::F64);
  for (size_t i = 0; i < model.num_layers(); i++) {
    const nn::RoutingStats* s = model.routing_stats(i);
    if (!s || s->tokens_per_expert.empty()) continue;
    auto k = static_cast<int64_t>(static_cast<size_t>(model.global_layer(i)) * slot);
    t.set_item(k++, 1.0);
    for (int64_t n : s->tokens_per_expert) t.set_item(k++, static_cast<double>(n));
    t.set_item(k++, s->entropy_sum);
    t.set_item(k, static_cast<double>(s->tokens));
  }
  if (g.distributed()) g.tp_dp->all_reduce(t);
  if (pipeline) g.pp->all_reduce(t);
  std::vector<LayerRouting> v;
  for (size_t l = 0; l < L; l++) {
    auto k = static_cast<int64_t>(l * slot);
    if (t.item(k++) <= 0) continue;
    LayerRouting r{l, std::vector<double>(E), 0.0};
    for (double& n : r.tokens_per_expert) n = t.item(k++);
    const double sum = t.item(k++), n = t.item(k);
    r.entropy = n > 0 ? sum / n : 0.0;
    v.push_back(std::move(r));
  }
  return v;
}

HealthAlarms::HealthAlarms(const TrainConfig& c, int64_t ep_size) : c_(c), ep_size_(std::max<int64_t>(1, ep_size)) {}

bool HealthAlarms::spiking(Spike& s, double v, double factor, int64_t samples) {
  const double a = std::fabs(v);
  if (!std::isfinite(a)) return false;  // non-finite values are the NaN check's
  if (s.count < samples) {
    s.count++;
    s.max = std::max(s.max, a);
    return false;
  }
  if (a < s.max * factor) {
    s.warned = false;  // the episode is over
    return false;
  }
  if (s.warned) return false;
  s.warned = true;
  return true;
}

std::string HealthAlarms::expert_place(int64_t e) const {
  if (ep_size_ == 1) return fmt::format("expert {}", e);
  const int64_t per = std::max<int64_t>(1, c_.num_experts / ep_size_);
  return fmt::format("expert {} (on expert-parallel rank {})", e, e / per);
}

std::vector<Alarm> HealthAlarms::after_step(int64_t it, const StepResult& r, const std::vector<LayerRouting>& routing) {
  std::vector<Alarm> out;
  auto alarm = [&](const std::string& name, std::string message) {
    const auto& s = c_.health_alarm_stop;
    out.push_back({name, std::find(s.begin(), s.end(), name) != s.end(), std::move(message)});
  };
  const bool first = first_step_;
  first_step_ = false;
  for (const LayerRouting& l : routing) {
    const auto E = static_cast<int64_t>(l.tokens_per_expert.size());
    if (c_.moe_dead_expert_steps > 0) {
      auto& idle = idle_[l.layer];
      idle.resize(static_cast<size_t>(E), 0);
      std::string dead;
      for (int64_t e = 0; e < E; e++) {
        int64_t& n = idle[static_cast<size_t>(e)];
        n = l.tokens_per_expert[static_cast<size_t>(e)] > 0 ? 0 : n + 1;
        if (n == c_.moe_dead_expert_steps) dead += (dead.empty() ? "" : ", ") + expert_place(e);
      }
      if (!dead.empty())
        alarm("dead-expert",
              fmt::format("iteration {}: layer {}: {} received no tokens for {} steps in a row (over all ranks; "
                          "--moe-dead-expert-steps {}): raise --moe-aux-loss-coeff, try "
                          "--moe-router-enable-expert-bias, or lower --lr",
                          it, l.layer, dead, c_.moe_dead_expert_steps, c_.moe_dead_expert_steps));
    }
    double sum = 0;
    for (double n : l.tokens_per_expert) sum += n;
    if (c_.moe_load_imbalance_threshold > 0 && sum > 0) {
      const auto mx = std::max_element(l.tokens_per_expert.begin(), l.tokens_per_expert.end());
      const double ratio = *mx / (sum / static_cast<double>(E));
      int64_t& n = imbalanced_[l.layer];
      n = ratio > c_.moe_load_imbalance_threshold ? n + 1 : 0;
      if (n == c_.moe_load_imbalance_steps)
        alarm("load-imbalance",
              fmt::format("iteration {}: layer {}: max/mean expert load {:.2f} (the busiest: {}) has been above "
                          "--moe-load-imbalance-threshold {} for {} steps in a row (over all ranks): the router "
                          "favours few experts; raise --moe-aux-loss-coeff or use --moe-router-enable-expert-bias",
                          it, l.layer, ratio, expert_place(mx - l.tokens_per_expert.begin()),
                          c_.moe_load_imbalance_threshold, n));
    }
    if (c_.moe_router_entropy_collapse_fraction > 0 && E > 1) {
      const double floor = c_.moe_router_entropy_collapse_fraction * std::log(static_cast<double>(E));
      int64_t& n = collapsed_[l.layer];
      n = l.entropy < floor ? n + 1 : 0;
      if (n == c_.moe_router_entropy_collapse_steps)
        alarm("router-entropy-collapse",
              fmt::format("iteration {}: layer {}: the mean per-token router entropy {:.4f} nats has been below "
                          "--moe-router-entropy-collapse-fraction {} x ln({}) = {:.4f} for {} steps in a row (over "
                          "all ranks): each token's routing probabilities have collapsed onto few experts",
                          it, l.layer, l.entropy, c_.moe_router_entropy_collapse_fraction, E, floor, n));
    }
  }
  if (c_.moe_aux_loss_spike_factor > 0)
    for (size_t t = 0; t < r.aux_layers.size(); t++)
      for (size_t l = 0; l < r.aux_layers[t].size(); l++) {
        const double v = r.aux_layers[t][l];
        Spike& s = aux_[{t, l}];
        if (!spiking(s, v, c_.moe_aux_loss_spike_factor, c_.moe_aux_loss_spike_samples)) continue;
        const std::string type =
            t < c_.moe_router_load_balancing_type.size() ? c_.moe_router_load_balancing_type[t] : "aux_loss";
        alarm("aux-loss-spike",
              fmt::format("iteration {}: layer {}: its {} {:.6g} is >= --moe-aux-loss-spike-factor {} x {:.6g}, "
                          "its max over the first {} steps (reduced over all ranks): the routing balance broke down",
                          it, l < routing.size() ? routing[l].layer : l, type, v, c_.moe_aux_loss_spike_factor, s.max,
                          c_.moe_aux_loss_spike_samples));
      }
  // Megatron validates nothing on the first iteration of a process (rerun_state_machine: first_iteration_complete).
  if (c_.loss_spike_factor > 0 && !first && spiking(loss_, r.lm_loss, c_.loss_spike_factor, c_.loss_spike_samples))
    alarm("loss-spike",
          fmt::format("iteration {}: lm loss {:.6g} is >= --loss-spike-factor {} x {:.6g}, the max of the first {} "
                      "steps' losses (Megatron's --check-for-spiky-loss rule; the loss over the global batch, the "
                      "same on every rank)",
                      it, r.lm_loss, c_.loss_spike_factor, loss_.max, c_.loss_spike_samples));
  // A step the loss scaler skipped is its signal, not an alarm (nothing was applied).
  const bool finite = r.skipped || (std::isfinite(r.lm_loss) && std::isfinite(r.grad_norm));
  if (!finite && !nan_warned_)
    alarm("nan", fmt::format("iteration {}: the lm loss ({}) or gradient norm ({}) is not finite and the step was "
                             "applied (--no-check-for-nan-in-loss-and-grad, as Megatron); a checkpoint of non-finite "
                             "weights is refused",
                             it, r.lm_loss, r.grad_norm));
  nan_warned_ = !finite;
  return out;
}

void run_health_alarms(HealthAlarms& h, int64_t iteration, const StepResult& r, const nn::GPTModel& model,
                       const ParallelGroups& g, MetricsLog& log, std::FILE* out, bool tty, int64_t logging_level,
                       int64_t last_saved) {
  const std::vector<LayerRouting> routing = global_routing(model, g);
  const std::vector<Alarm> alarms = h.after_step(iteration, r, routing);
  for (const Alarm& a : alarms) {
    log.write_json(
        {{"alarm", a.name}, {"iteration", iteration}, {"action", a.stop ? "stop" : "warn"}, {"message", a.message}});
    if (a.stop) continue;
    if (out && logging_level <= 30) {  // a warning: Python logging's WARNING (30) in Megatron
      if (tty) fmt::print(out, "\r\033[K");
      fmt::print(out, "warning: {}\n", a.message);
    }
  }
  for (const Alarm& a : alarms)
    MOE_CHECK(!a.stop,
              "health alarm {} (--health-alarm-stop): {}.\nEvery rank stopped after iteration {}; that step is not "
              "saved{}.",
              a.name, a.message, iteration,
              last_saved >= 0 ? fmt::format(" (the last checkpoint is iteration {})", last_saved) : "");
}

}  // namespace moecore::train
