// Megatron's TensorBoard tags (see tensorboard_log.h).
#include "moecore/train/observe/tensorboard_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "moecore/core/allocator.h"
#include "moecore/core/tensor.h"
#include "moecore/device/runtime.h"
#include "moecore/moe/router.h"

namespace moecore::train {

namespace {
// Megatron's tracker names of the load-balancing types (track_names in training_log), "" for none.
std::string loss_name(const std::string& type) {
  const std::string n = moe::load_balancing_name(moe::parse_load_balancing_type(type));
  return n == "none" ? "" : n;
}
}  // namespace

TensorBoardLog::TensorBoardLog(const TrainConfig& c, const ParallelGroups& g) : c_(c), g_(g) {
  world_size_ = g.world ? g.world->size() : 1;
  if (!c.tensorboard_dir.empty() && g.world_rank == world_size_ - 1)
    writer_ = std::make_unique<EventFileWriter>(c.tensorboard_dir, c.tensorboard_queue_size);
}

void TensorBoardLog::scalar(const std::string& tag, double v, int64_t step) {
  if (writer_) writer_->add_scalar(tag, v, step);
}

void TensorBoardLog::flush() {
  if (writer_) writer_->flush();
}

void TensorBoardLog::after_step(int64_t it, int64_t samples, const StepResult& r, const nn::GPTModel& model,
                                const Scalars& extra) {
  if (c_.tensorboard_dir.empty()) return;
  if (it % c_.tensorboard_log_interval == 0) {
    auto both = [&](const std::string& tag, double v) {
      scalar(tag, v, it);
      scalar(tag + " vs samples", v, samples);
    };
    both("learning-rate", r.lr);
    both("batch-size", static_cast<double>(c_.global_batch_size));
    both("lm loss", r.lm_loss);
    if (!c_.no_log_loss_scale_to_tensorboard) both("loss-scale", r.loss_scale);  // 1 without a loss scaler
    if (c_.log_world_size_to_tensorboard) both("world-size", static_cast<double>(world_size_));
    if (!r.skipped) both("grad-norm", r.grad_norm);  // Megatron has none for a step the loss scaler skipped
    for (const auto& [tag, v] : extra) both(tag, v);
    if (c_.log_memory_to_tensorboard) {  // the training device allocator's counters (torch.cuda.memory_stats())
      const AllocatorStats m = device::memory_stats(device_);
      scalar("mem-reserved-bytes", static_cast<double>(m.system_bytes), it);
      scalar("mem-allocated-bytes", static_cast<double>(m.live_bytes), it);
      scalar("mem-max-allocated-bytes", static_cast<double>(m.peak_bytes), it);
    }
    expert_loads(it, model);
  }
  moe_losses(it, r, model);
  for (size_t k = 0; k < r.mtp_losses.size(); k++)  // Megatron's track_mtp_metrics: every iteration
    scalar(fmt::format("mtp_{} loss", k + 1), r.mtp_losses[k], it);
}

void TensorBoardLog::moe_losses(int64_t it, const StepResult& r, const nn::GPTModel& model) {
  if (c_.num_experts == 0) return;
  const auto& types = c_.moe_router_load_balancing_type;
  for (size_t t = 0; t < types.size() && t < r.aux_losses.size(); t++)
    if (const std::string n = loss_name(types[t]); !n.empty()) scalar(n, r.aux_losses[t], it);
  if (c_.moe_z_loss_coeff > 0) scalar("z_loss", r.z_loss, it);
  if (!c_.moe_per_layer_logging) return;
  // Per layer: router_losses' reductions (r.aux_layers, r.z_layers: the MoE layers in layer order); 0 for the
  // dense layers, as Megatron's tracker writes every layer.
  const size_t T = types.size();
  for (size_t t = 0; t <= T; t++) {
    const std::string n = t < T ? loss_name(types[t]) : (c_.moe_z_loss_coeff > 0 ? "z_loss" : "");
    if (n.empty()) continue;
    const std::vector<double>& per_moe_layer = t < T ? r.aux_layers.at(t) : r.z_layers;
    size_t k = 0;  // the layer's index among the MoE layers (r.moe_layer_ids: every pipeline stage's)
    for (int64_t i = 0; i < c_.num_layers; i++) {
      const bool moe = k < r.moe_layer_ids.size() && r.moe_layer_ids[k] == i;
      const double v = moe ? per_moe_layer.at(k++) : 0.0;
      scalar(fmt::format("moe/{}_layer_{}", n, i), v, it);
    }
  }
}

// Pipeline parallelism: each stage's layers summed over its TP×DP, then placed by global layer index and summed
// over the pipeline group (each layer lives on one stage), so the last rank writes every MoE layer.
void TensorBoardLog::gather_over_pipeline(std::vector<std::pair<size_t, std::vector<int64_t>>>& layers,
                                          int64_t& n) const {
  const int64_t E = c_.num_experts, L = c_.num_layers;
  Tensor t = Tensor::zeros({n > 0 ? n : 1}, DType::F64);
  int64_t k = 0;
  for (const auto& [i, tpe] : layers)
    for (int64_t x : tpe) t.set_item(k++, static_cast<double>(x));
  if (n > 0) g_.tp_dp->all_reduce(t);
  Tensor all = Tensor::zeros({L * (E + 1)}, DType::F64);  // per layer: present, then E counts
  k = 0;
  for (const auto& [i, tpe] : layers) {
    MOE_ASSERT(static_cast<int64_t>(tpe.size()) == E);
    all.set_item(static_cast<int64_t>(i) * (E + 1), 1.0);
    for (int64_t e = 0; e < E; e++) all.set_item(static_cast<int64_t>(i) * (E + 1) + 1 + e, t.item(k++));
  }
  g_.pp->all_reduce(all);
  layers.clear();
  n = 0;
  for (int64_t i = 0; i < L; i++) {
    if (all.item(i * (E + 1)) <= 0) continue;
    std::vector<int64_t> tpe(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; e++) tpe[static_cast<size_t>(e)] = std::llround(all.item(i * (E + 1) + 1 + e));
    layers.push_back({static_cast<size_t>(i), std::move(tpe)});
    n += E;
  }
}

void TensorBoardLog::expert_loads(int64_t it, const nn::GPTModel& model) {
  // Tokens per expert of the step, summed over TP×DP (all the step's tokens), one histogram per MoE layer (by
  // global layer index).
  std::vector<std::pair<size_t, std::vector<int64_t>>> layers;
  int64_t n = 0;
  for (size_t i = 0; i < model.num_layers(); i++)
    if (const nn::RoutingStats* s = model.routing_stats(i); s && !s->tokens_per_expert.empty()) {
      layers.push_back({static_cast<size_t>(model.global_layer(i)), s->tokens_per_expert});
      n += static_cast<int64_t>(s->tokens_per_expert.size());
    }
  if (g_.pp_size > 1) gather_over_pipeline(layers, n);  // every stage's layers (collective over PP)
  if (layers.empty()) return;
  if (g_.distributed() && g_.pp_size == 1) {
    Tensor t = Tensor::empty({n}, DType::F64);
    int64_t k = 0;
    for (const auto& [i, tpe] : layers)
      for (int64_t x : tpe) t.set_item(k++, static_cast<double>(x));
    g_.tp_dp->all_reduce(t);
    k = 0;
    for (auto& [i, tpe] : layers)
      for (int64_t& x : tpe) x = std::llround(t.item(k++));
  }
  if (writer_)
    for (const auto& [i, tpe] : layers)
      writer_->add_histogram(fmt::format("moe/tokens_per_expert_layer_{}", i), expert_load_histogram(tpe), it);
}

void TensorBoardLog::at_log_interval(int64_t it, double seconds_per_iteration, const std::vector<TimerRow>& timers) {
  if (c_.tensorboard_dir.empty() || !c_.log_timers_to_tensorboard) return;
  scalar("iteration-time", seconds_per_iteration, it);
  for (const TimerRow& t : timers) scalar(t.name + "-time", t.max_ms / 1000.0, it);  // the slowest rank's
}

void TensorBoardLog::validation(int64_t it, int64_t samples, double loss) {
  if (c_.skip_train) return;  // Megatron writes the final evaluation only when it trained
  scalar("lm loss validation", loss, it);
  scalar("lm loss validation vs samples", loss, samples);
  if (c_.log_validation_ppl_to_tensorboard) {
    const double ppl = std::exp(std::min(20.0, loss));
    scalar("lm loss validation ppl", ppl, it);
    scalar("lm loss validation ppl vs samples", ppl, samples);
  }
}

}  // namespace moecore::train
