// Step numbers, log line, metrics file, memory plan and expert-load bars (see metrics.h).
#include "moecore/train/observe/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "moecore/core/allocator.h"
#include "moecore/core/error.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/train/config/optimizer_config.h"

namespace moecore::train {

namespace {
// The routing statistics of the last global batch, by layer index, of the layers that route (MoE layers).
std::vector<std::pair<size_t, const nn::RoutingStats*>> routed_layers(const nn::GPTModel& model) {
  std::vector<std::pair<size_t, const nn::RoutingStats*>> v;
  for (size_t i = 0; i < model.num_layers(); i++)
    if (const nn::RoutingStats* s = model.routing_stats(i)) v.push_back({i, s});
  return v;
}

// --moe-per-layer-logging: each MoE layer's aux and z losses of the last step (Megatron writes them as
// moe/<name>_layer_<i>, i the layer's index among all layers; their mean over the MoE layers is the total).
std::string per_layer_losses(const StepResult& r, const std::vector<std::string>& loss_types, bool z_loss,
                             nlohmann::json& j) {
  std::string line;
  auto add = [&](const std::string& name, const std::vector<double>& v) {
    line += fmt::format(" {} per layer:", name);
    for (size_t l = 0; l < r.moe_layer_ids.size() && l < v.size(); l++) {
      line += fmt::format(" {:.4f}", v[l]);
      j[fmt::format("moe/{}_layer_{}", name, r.moe_layer_ids[l])] = v[l];
    }
    line += " |";
  };
  for (size_t t = 0; t < r.aux_layers.size() && t < loss_types.size(); t++) {
    const std::string name = moe::load_balancing_name(moe::parse_load_balancing_type(loss_types[t]));
    if (name != "none") add(name, r.aux_layers[t]);
  }
  if (z_loss) add("z_loss", r.z_layers);
  return line;
}

// The layers' routing counts of the step over all ranks: each TP×DP rank routed its own tokens to all E experts,
// so counts and entropy sums add up (the same reduction as TensorBoard's tokens-per-expert histograms).
std::vector<nn::RoutingStats> step_routing(const std::vector<std::pair<size_t, const nn::RoutingStats*>>& layers,
                                           const ParallelGroups* g) {
  std::vector<nn::RoutingStats> out;
  int64_t n = 0;
  for (const auto& [i, s] : layers) {
    out.push_back(*s);
    n += static_cast<int64_t>(s->tokens_per_expert.size()) + 3;
  }
  if (!g || !g->distributed() || out.empty()) return out;
  Tensor t = Tensor::empty({n}, DType::F64);
  int64_t k = 0;
  for (const auto& s : out) {
    for (int64_t x : s.tokens_per_expert) t.set_item(k++, static_cast<double>(x));
    t.set_item(k++, static_cast<double>(s.dropped));
    t.set_item(k++, s.entropy_sum);
    t.set_item(k++, static_cast<double>(s.tokens));
  }
  g->tp_dp->all_reduce(t);
  k = 0;
  for (auto& s : out) {
    for (int64_t& x : s.tokens_per_expert) x = std::llround(t.item(k++));
    s.dropped = std::llround(t.item(k++));
    s.entropy_sum = t.item(k++);
    s.tokens = std::llround(t.item(k++));
  }
  return out;
}

// Pipeline parallelism: each stage reduced its own MoE layers; the per-layer values are summed over the pipeline
// group by global layer index (each layer lives on one stage), so every rank sees every MoE layer in layer order.
void gather_over_pipeline(const TrainConfig& c, const ParallelGroups& g, StepResult& r) {
  const size_t n = r.aux_layers.size(), Lg = static_cast<size_t>(c.num_layers);
  Tensor a = Tensor::zeros({static_cast<int64_t>((n + 2) * Lg)}, DType::F64);
  for (size_t l = 0; l < r.moe_layer_ids.size(); l++) {
    const size_t gl = static_cast<size_t>(r.moe_layer_ids[l]);
    for (size_t t = 0; t < n; t++) a.set_item(static_cast<int64_t>(t * Lg + gl), r.aux_layers[t][l]);
    a.set_item(static_cast<int64_t>(n * Lg + gl), r.z_layers[l]);
    a.set_item(static_cast<int64_t>((n + 1) * Lg + gl), 1.0);
  }
  g.pp->all_reduce(a);
  r.moe_layer_ids.clear();
  for (size_t gl = 0; gl < Lg; gl++)
    if (a.item(static_cast<int64_t>((n + 1) * Lg + gl)) > 0) r.moe_layer_ids.push_back(static_cast<int64_t>(gl));
  for (size_t t = 0; t <= n; t++) {
    std::vector<double>& v = t < n ? r.aux_layers[t] : r.z_layers;
    v.clear();
    for (int64_t gl : r.moe_layer_ids) v.push_back(a.item(static_cast<int64_t>(t * Lg + static_cast<size_t>(gl))));
  }
}
}  // namespace

void router_losses(const TrainConfig& c, const nn::GPTModel& model, const ParallelGroups& g, StepResult& r) {
  const size_t n = c.moe_router_load_balancing_type.size();
  const auto layers = routed_layers(model);
  const size_t L = layers.size();
  r.aux_layers.assign(n, std::vector<double>(L, 0.0));
  r.z_layers.assign(L, 0.0);
  for (size_t l = 0; l < L; l++) {  // per layer: L/coeff averaged over the micro-batches (Megatron's loss_scale)
    const nn::RoutingStats& s = *layers[l].second;
    const double mb = static_cast<double>(std::max<int64_t>(1, s.micro_batches));
    for (size_t t = 0; t < s.loss_sums.size() && t < n; t++) r.aux_layers[t][l] = s.loss_sums[t] / mb;
    r.z_layers[l] = s.z_loss_sum / mb;
  }
  if (g.distributed() && L > 0) {  // [type][layer] then z by layer, in one all-reduce
    Tensor a = Tensor::empty({static_cast<int64_t>((n + 1) * L)}, DType::F64);
    int64_t i = 0;
    for (size_t t = 0; t < n; t++)
      for (size_t l = 0; l < L; l++) a.set_item(i++, r.aux_layers[t][l]);
    for (size_t l = 0; l < L; l++) a.set_item(i++, r.z_layers[l]);
    g.tp_dp->all_reduce(a);
    const double dp = static_cast<double>(g.dp_size);
    i = 0;
    for (size_t t = 0; t < n; t++) {
      const double div = c.moe_router_load_balancing_type[t] == "global_aux_loss" ? 1.0 : dp;
      for (size_t l = 0; l < L; l++) r.aux_layers[t][l] = a.item(i++) / div;
    }
    for (size_t l = 0; l < L; l++) r.z_layers[l] = a.item(i++) / dp;
  }
  r.moe_layer_ids.clear();
  for (const auto& [i, s] : layers) r.moe_layer_ids.push_back(model.global_layer(i));
  if (g.pp_size > 1) gather_over_pipeline(c, g, r);
  // The totals: means over the MoE layers (of every stage).
  const size_t L_all = r.moe_layer_ids.size();
  const double Ld = static_cast<double>(L_all);
  r.aux_losses.assign(n, 0.0);
  r.z_loss = 0;
  for (size_t l = 0; l < L_all; l++) {
    for (size_t t = 0; t < n; t++) r.aux_losses[t] += r.aux_layers[t][l] / Ld;
    r.z_loss += r.z_layers[l] / Ld;
  }
}

void mtp_losses(const TrainConfig& c, nn::GPTModel& model, const ParallelGroups& g, StepResult& r) {
  r.mtp_losses.clear();
  if (c.mtp_num_layers == 0) return;
  const size_t D = static_cast<size_t>(c.mtp_num_layers);
  std::vector<double> v = model.mtp() ? model.take_mtp_losses() : std::vector<double>(D, 0.0);
  if (g.distributed()) {  // only the loss stage holds values; its TP ranks equal copies: sum / (TP×DP)
    Tensor t = Tensor::empty({static_cast<int64_t>(D)}, DType::F64);
    for (size_t k = 0; k < D; k++) t.set_item(static_cast<int64_t>(k), v[k]);
    g.world->all_reduce(t);
    const double copies = static_cast<double>(ParallelGroups::size(g.world) / g.pp_size);
    for (size_t k = 0; k < D; k++) v[k] = t.item(static_cast<int64_t>(k)) / copies;
  }
  r.mtp_losses = v;
}

void param_stats(const TrainConfig& c, const nn::ParamRegistry& reg, const ParallelGroups& g,
                 const optim::ChainedOptimizer* opt, StepResult& r) {
  if (!c.log_params_norm) return;
  // The ranks holding the same values: experts' over EDP; dense over DP×CP, and over TP too unless split by TP
  // (Megatron's param_is_not_tensor_parallel_duplicate). The same weights as the optimizer's gradient norm.
  const double dp = static_cast<double>(ParallelGroups::size(g.dp)),
               tp = static_cast<double>(ParallelGroups::size(g.tp));
  const double edp = static_cast<double>(ParallelGroups::size(g.edp));
  auto weight = [&](const nn::Parameter& p) {
    // The last stage's copy of the tied word embedding is Megatron's `shared` parameter: counted once.
    if (g.pp_rank > 0 && p.name == "embedding.word_embeddings.weight") return 0.0;
    return p.expert_parallel ? 1.0 / edp : 1.0 / (dp * (p.tensor_parallel ? 1.0 : tp));
  };
  double sq = 0;
  if (opt) {  // the fp32 masters where the model holds bf16 (Megatron reads the main parameters)
    sq = opt->master_sum_squares(weight);
  } else {
    for (const auto& p : reg.all()) sq += weight(*p) * kernels::sum_squares(p->value);
  }
  if (g.distributed()) {
    Tensor u = Tensor::empty({1}, DType::F64);
    u.set_item(0, sq);
    g.world->all_reduce(u);
    sq = u.item(0);
  }
  r.params_norm = std::sqrt(sq);
}

void IntervalSums::add(const StepResult& r) {
  if (r.skipped) {
    skipped++;
    if (!std::isfinite(r.lm_loss)) nan++;
    return;
  }
  lm_loss += r.lm_loss;
  grad_norm += r.grad_norm;
  z_loss += r.z_loss;
  if (aux.size() < r.aux_losses.size()) aux.resize(r.aux_losses.size(), 0.0);
  for (size_t t = 0; t < r.aux_losses.size(); t++) aux[t] += r.aux_losses[t];
  if (mtp.size() < r.mtp_losses.size()) mtp.resize(r.mtp_losses.size(), 0.0);
  for (size_t k = 0; k < r.mtp_losses.size(); k++) mtp[k] += r.mtp_losses[k];
  steps++;
}

nlohmann::json IntervalSums::to_json() const {
  nlohmann::json j = {{"lm_loss", lm_loss}, {"grad_norm", grad_norm}, {"z_loss", z_loss}, {"aux", aux},
                      {"mtp", mtp},         {"steps", steps}};
  if (skipped > 0) j["skipped"] = skipped;
  if (nan > 0) j["nan"] = nan;
  return j;
}

IntervalSums IntervalSums::from_json(const nlohmann::json& j) {
  // JSON writes NaN as null: read it back as NaN (a diverged run's sums still resume).
  auto num = [](const nlohmann::json& v) { return v.is_null() ? std::nan("") : v.get<double>(); };
  IntervalSums s;
  s.lm_loss = num(j.at("lm_loss"));
  s.grad_norm = num(j.at("grad_norm"));
  s.z_loss = num(j.at("z_loss"));
  for (const auto& a : j.at("aux")) s.aux.push_back(num(a));
  if (j.contains("mtp"))
    for (const auto& a : j.at("mtp")) s.mtp.push_back(num(a));
  s.steps = j.at("steps").get<int64_t>();
  s.skipped = j.value("skipped", int64_t{0});
  s.nan = j.value("nan", int64_t{0});
  return s;
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  return fmt::format("{:.1f} {}", b, u[i]);
}

std::string progress_line(int64_t iteration, int64_t train_iters, double lm_loss, double tokens_per_sec,
                          double eta_seconds) {
  return fmt::format("iteration {}/{} | lm loss {:.4f} | {:.0f} tokens/s | ETA {}", iteration, train_iters, lm_loss,
                     tokens_per_sec, format_duration(eta_seconds));
}

MetricsLog::MetricsLog(const TrainConfig& c, std::FILE* out, const std::string& metrics_file, bool resume,
                       int64_t world_size, const ParallelGroups* groups)
    : c_(c), out_(out), world_size_(world_size), groups_(groups) {
  if (metrics_file.empty()) return;
  // A resumed run appends to the history (lines past the checkpoint from an interrupted run repeat iterations;
  // the later line is the one that counts).
  try {
    file_.open(metrics_file, resume);
  } catch (const Error& e) {
    MOE_CHECK(false, "--metrics-file: {}", e.what());
  }
}

void MetricsLog::write_json(const nlohmann::json& line) {
  if (file_.is_open()) file_.write_line(line.dump());
}

void MetricsLog::after_step(const StepResult& r) {
  forward_backward_seconds_ += r.forward_backward_seconds;
  optimizer_seconds_ += r.optimizer_seconds;
}

void MetricsLog::log_validation(int64_t iteration, double v) {
  if (out_)
    fmt::print(out_, " validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.3f}\n", iteration, v,
               std::exp(std::min(v, 50.0)));
  write_json({{"eval", "valid"}, {"iteration", iteration}, {"lm_loss", v}});
}

void MetricsLog::log_interval(int64_t iteration, int64_t consumed_samples, const StepResult& r, IntervalSums& sums,
                              double seconds, double step_flops, double peak_gflops, const nn::GPTModel& model) {
  const auto layers = routed_layers(model);
  const double n = static_cast<double>(std::max<int64_t>(1, sums.steps));  // averages over the applied steps
  const int64_t steps = sums.iterations();  // throughput over every step run, skipped or not
  const double tokens = static_cast<double>(steps * c_.global_batch_size * c_.seq_length);
  const double tps = tokens / seconds;
  const double gflops = step_flops * static_cast<double>(steps) / seconds / 1e9;  // the whole job's
  // The job's GEMM peak: every rank at the peak this rank measured (gflops counts every rank's work).
  const double job_peak = peak_gflops * static_cast<double>(world_size_);
  const double peak_share = job_peak > 0 ? gflops / job_peak : 0.0;
  const auto mem = device::memory_stats(device_);
  std::string aux;
  nlohmann::json j = {{"iteration", iteration},
                      {"consumed_samples", consumed_samples},
                      {"lr", r.lr},
                      {"lm_loss", sums.lm_loss / n},
                      {"grad_norm", sums.grad_norm / n},
                      {"tokens_per_sec", tps},
                      {"gflops", gflops},
                      {"gflops_ratio_to_gemm_peak", peak_share},
                      {"peak_memory_bytes", mem.peak_bytes},
                      {"planned_memory_bytes", planned_memory_}};
  for (size_t k = 0; k < sums.mtp.size(); k++) {  // Megatron's total_loss_dict entries, after lm loss
    const double v = sums.mtp[k] / n;
    aux += fmt::format(" mtp_{} loss: {:.6E} |", k + 1, v);
    j[fmt::format("mtp_{}_loss", k + 1)] = v;
  }
  if (!layers.empty() || (c_.num_experts > 0 && !r.moe_layer_ids.empty())) {  // this stage may hold none
    for (size_t t = 0; t < c_.moe_router_load_balancing_type.size(); t++) {
      const std::string name =
          moe::load_balancing_name(moe::parse_load_balancing_type(c_.moe_router_load_balancing_type[t]));
      if (name == "none" || name == "sinkhorn") continue;  // no loss to log
      const double v = t < sums.aux.size() ? sums.aux[t] / n : 0.0;
      aux += fmt::format(" {}: {:.4f} |", name, v);
      j[name] = v;
    }
    if (c_.moe_z_loss_coeff > 0) {
      aux += fmt::format(" z_loss: {:.4f} |", sums.z_loss / n);
      j["z_loss"] = sums.z_loss / n;
    }
    nlohmann::json tpe = nlohmann::json::object(), entropy = nlohmann::json::object(),
                   dropped = nlohmann::json::object();
    double worst = 0;
    const std::vector<nn::RoutingStats> all = step_routing(layers, groups_);
    for (size_t l = 0; l < layers.size(); l++) {
      const nn::RoutingStats& s = all[l];
      const std::string key = "layer_" + std::to_string(layers[l].first);
      tpe[key] = s.tokens_per_expert;
      entropy[key] = s.entropy();
      dropped[key] = s.dropped;
      worst = std::max(worst, s.max_load() / std::max(1.0, s.mean_load()));
    }
    j["tokens_per_expert"] = tpe;
    j["router_entropy"] = entropy;  // nats, mean over the step's tokens
    j["dropped_assignments"] = dropped;
    j["max_over_mean_expert_load"] = worst;
    aux += fmt::format(" max/mean expert load: {:.2f} |", worst);
    if (c_.moe_per_layer_logging)
      aux += per_layer_losses(r, c_.moe_router_load_balancing_type, c_.moe_z_loss_coeff > 0, j);
  }
  {  // the timers, seconds per iteration of the interval, the slowest rank's
    Tensor t = Tensor::empty({2}, DType::F64);
    const double its = static_cast<double>(std::max<int64_t>(1, steps));
    t.set_item(0, forward_backward_seconds_ / its);
    t.set_item(1, optimizer_seconds_ / its);
    if (groups_ && groups_->distributed()) groups_->world->all_reduce(t, comm::ReduceOp::Max);
    j["timers/forward-backward"] = t.item(0);
    j["timers/optimizer"] = t.item(1);
    forward_backward_seconds_ = optimizer_seconds_ = 0;
  }
  // Megatron's optional fields: throughput after the timing, num zeros and params norm after the grad norm.
  std::string throughput, after_norm;
  if (c_.log_throughput) {
    const double tflops = step_flops * static_cast<double>(steps) / seconds / 1e12 / static_cast<double>(world_size_);
    throughput = fmt::format(" throughput per GPU (TFLOP/s/GPU): {:.3f} |", tflops);
    j["throughput_tflops_per_gpu"] = tflops;
  }
  if (c_.log_num_zeros_in_grad) {
    after_norm += fmt::format(" num zeros: {} |", r.num_zeros);
    j["num_zeros"] = r.num_zeros;
  }
  if (c_.log_params_norm) {
    after_norm += fmt::format(" params norm: {:.3f} |", r.params_norm);
    j["params_norm"] = r.params_norm;
  }
  if (loss_scaling(c_)) {  // Megatron's fields where a loss scaler acts: the scale, skipped and nan iterations
    aux += fmt::format(" loss scale: {:.1f} |", r.loss_scale);
    after_norm +=
        fmt::format(" number of skipped iterations: {:3d} | number of nan iterations: {:3d} |", sums.skipped, sums.nan);
    j["loss_scale"] = r.loss_scale;
    j["skipped_iterations"] = sums.skipped;
    j["nan_iterations"] = sums.nan;
  }
  if (out_) {
    fmt::print(
        out_,
        " iteration {:>8}/{:>8} | consumed samples: {:>10} |{} learning rate: {:.6E} | lm loss: {:.6E} |{} "
        "grad norm: {:.3f} |{} tokens/s: {:.0f} | GFLOP/s: {:.1f} ({:.1f}% of GEMM peak) | peak memory: {} (plan {})\n",
        iteration, c_.train_iters, consumed_samples, throughput, r.lr, sums.lm_loss / n, aux, sums.grad_norm / n,
        after_norm, tps, gflops, 100.0 * peak_share, human_bytes(static_cast<double>(mem.peak_bytes)),
        human_bytes(planned_memory_));
    flush_checked(out_, "training log");
  }
  write_json(j);
  const size_t types = sums.aux.size();
  const size_t depths = sums.mtp.size();
  sums = IntervalSums{};
  sums.aux.assign(types, 0.0);
  sums.mtp.assign(depths, 0.0);
}

MemoryPlan print_memory_plan(std::FILE* out, const TrainConfig& c, const nn::ParamRegistry& reg, int64_t vocab,
                             int64_t padded_vocab, const ParallelGroups& g) {
  ParamCounts p;
  for (auto& q : reg.all()) {
    const bool expert = q->name.find(".experts.") != std::string::npos;
    const auto n = static_cast<double>(q->value.numel());
    (expert ? p.expert : p.dense) += n;
    if (q->fp8)  // FP8 weights (--fp8-param-gather): f32 read-backs with masters apart
      (expert ? p.fp8_expert : p.fp8_dense) += n;
    else if (!q->low_storage)
      (expert ? p.f32_expert : p.f32_dense) += n;  // kept f32 under --bf16, --fp16
  }
  fmt::print(out, "parameters: {:.2f} M ({:.2f} M in routed experts); vocabulary {} padded to {}\n",
             (p.dense + p.expert) / 1e6, p.expert / 1e6, vocab, padded_vocab);
  const PlanLayout l = PlanLayout::from(c, g.world ? g.world->size() : 1);
  const ParamCounts counted = count_params(c, padded_vocab, l.tp, l.ep * l.etp, g.pp_rank);
  p.bf16_copy = counted.bf16_copy;
  // Megatron FSDP's units, as planned.
  p.largest_layer = counted.largest_layer, p.largest_layer_f32 = counted.largest_layer_f32;
  p.largest_layer_fp8 = counted.largest_layer_fp8;
  p.ends = counted.ends, p.ends_f32 = counted.ends_f32;
  const MemoryPlan m = plan_memory(c, padded_vocab, l, g.pp_rank, &p);
  fmt::print(out, "memory plan: {} | total {} per rank\n", m.describe(), human_bytes(m.total()));
  if (l.pp > 1) {
    const std::vector<MemoryPlan> stages = plan_memory_stages(c, padded_vocab, l);
    const MemoryPlan& w = worst_stage(stages);
    fmt::print(out, "memory plan, worst pipeline stage: {} per rank on stage {} ({:.2f} micro-batches in flight)\n",
               human_bytes(w.total()), w.pp_rank, w.in_flight);
  }
  return m;
}

void print_expert_load(std::FILE* out, const nn::GPTModel& model, bool distributed) {
  for (const auto& [i, s] : routed_layers(model)) {
    if (s->tokens_per_expert.empty()) continue;
    const auto& t = s->tokens_per_expert;
    const int64_t mx = *std::max_element(t.begin(), t.end());
    std::string bars;
    for (int64_t c : t)
      bars += fmt::format(" {}:{}", c, std::string(static_cast<size_t>(mx > 0 ? 1 + 8 * c / mx : 0), '#'));
    fmt::print(out, "expert load, layer {} (tokens per expert, last step{}):{}\n", i,
               distributed ? ", this rank's tokens" : "", bars);
  }
}

}  // namespace moecore::train
