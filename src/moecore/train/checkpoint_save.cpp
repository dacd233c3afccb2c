// Saving the training state (see checkpoint_save.h).
#include "moecore/train/checkpoint_save.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moecore/ckpt/metadata.h"
#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/core/timer.h"

namespace moecore::train {

OnHost::OnHost(nn::ParamRegistry& reg, nn::GPTModel& model, optim::ChainedOptimizer* opt)
    : reg_(reg), model_(model), opt_(opt), dev_(reg.device()) {
  std::vector<Tensor> w;
  if (opt_) opt_->gather_master(w);
  const auto& all = reg_.all();
  for (size_t i = 0; i < all.size(); i++) {
    nn::Parameter& p = *all[i];
    own_.push_back(p.value);
    if (!opt_) {  // the value itself where it is an f32 host tensor (loads write into the model directly)
      Tensor h = p.value.to(Device::cpu());
      w.push_back(h.dtype() == p.math_dtype() ? h : h.to(p.math_dtype()));
    }
    p.value = w[i];
  }
  move_router_state(Device::cpu());  // nothing moves on the CPU
}

OnHost::~OnHost() {
  try {
    restore();
    move_router_state(dev_);
  } catch (...) {  // an error already on its way out says more than a failed copy back
  }
}

void OnHost::restore() {
  if (restored_) return;
  const auto& all = reg_.all();
  for (size_t i = 0; i < all.size(); i++) all[i]->value = own_[i];
  restored_ = true;
}

void OnHost::commit() {
  MOE_ASSERT(!restored_);
  std::vector<Tensor> w;
  for (auto& p : reg_.all()) w.push_back(p->value);
  restore();
  if (opt_) {
    opt_->load_master(w);
  } else {
    const auto& all = reg_.all();
    for (size_t i = 0; i < all.size(); i++) all[i]->value.copy_from(w[i]);  // nothing where it is the same tensor
  }
  for (auto& p : reg_.all()) p->low_cache_from_update = false;  // the weights changed: round them afresh
}

void OnHost::move_router_state(Device d) {
  for (auto* l : moe_layers(model_)) l->router().expert_bias() = l->router().expert_bias().to(d);
}

std::string CheckpointedState::expert_bias_name(moe::MoELayer& l) {
  const std::string& w = l.router().weight().name;  // ...mlp.router.weight
  return w.substr(0, w.size() - std::string("weight").size()) + "expert_bias";
}

bool CheckpointedState::is_vocab_parameter(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

nlohmann::json scheduler_state(const optim::LRSchedule& s, int64_t num_steps) {
  return {{"max_lr", s.max_lr},
          {"lr_warmup_steps", s.warmup_iters},
          {"num_steps", num_steps},
          {"lr_decay_style", s.style},
          {"lr_decay_steps", s.decay_iters},
          {"min_lr", s.min_lr},
          {"start_wd", s.start_wd},
          {"end_wd", s.end_wd},
          {"wd_incr_style", s.wd_incr_style},
          {"wd_incr_steps", s.wd_incr_steps}};
}

bool CheckpointSaver::stores(const nn::Parameter& p) const {
  if (!g_.distributed()) return true;
  // The last pipeline stage's copy of the tied word embedding: the first stage writes it (every tensor once).
  if (g_.pp_rank > 0 && p.name == "embedding.word_embeddings.weight") return false;
  if (p.expert_parallel) return g_.edp->rank() == 0;
  return g_.dp->rank() == 0 && (p.tensor_parallel || g_.tp->rank() == 0);
}

nlohmann::json CheckpointSaver::train_state(const Progress& p) const {
  nlohmann::json counts = nlohmann::json::object();
  for (auto* l : moe_layers(model_)) counts[l->router().weight().name] = l->router().forward_count();
  if (g_.pp_size > 1) {  // every stage's routers: gathered over the pipeline group (collective)
    std::vector<std::string> names(static_cast<size_t>(c_.num_layers));
    Tensor t = Tensor::zeros({2 * c_.num_layers}, DType::F64);
    for (size_t i = 0; i < model_.num_layers(); i++)
      if (auto* l = dynamic_cast<moe::MoELayer*>(&model_.layer(i).ffn())) {
        t.set_item(model_.global_layer(i), 1.0);
        t.set_item(c_.num_layers + model_.global_layer(i), static_cast<double>(l->router().forward_count()));
      }
    g_.pp->all_reduce(t);
    for (int64_t i = 0; i < c_.num_layers; i++)
      if (t.item(i) > 0)
        counts[fmt::format("decoder.layers.{}.mlp.router.weight", i)] =
            static_cast<uint64_t>(std::llround(t.item(c_.num_layers + i)));
  }
  auto size = [](const std::unique_ptr<comm::ProcessGroup>& g) { return ParallelGroups::size(g); };
  nlohmann::json state = {
      {"format", ckpt::kTrainStateFormat},
      {"moecore_version", MOECORE_VERSION},
      {"iteration", p.iteration},
      {"consumed_samples", p.cursor.consumed_samples},
      // Where this run's global batch size took effect: consumed_samples follows from it (validated on load).
      {"run_start", {{"iteration", run_start_iteration_}, {"consumed_samples", run_start_consumed_}}},
      {"optimizer", true},
      {"vocab", {{"size", vocab_.size}, {"padded", vocab_.padded}}},
      {"layout",
       {{"world", size(g_.world)},
        {"tp", size(g_.tp)},
        {"pp", size(g_.pp)},
        {"dp", g_.dp_size},
        {"cp", g_.cp_size},
        {"ep", size(g_.ep)},
        {"etp", size(g_.etp)},
        {"distributed_optimizer", opt_ && opt_->distributed()}}},
      {"rng", {{"seed", c_.seed}, {"router_forward_counts", counts}}},
      {"log_interval_sums", p.sums.to_json()},
      {"opt_param_scheduler", scheduler_state(p.schedule, p.schedule_steps)},
      {"config", config_json(c_)}};
  // Loss scaling: Megatron's grad_scaler state (with the optimizer's) and the steps it skipped (Adam's step count).
  if (p.skipped_iterations > 0) state["skipped_iterations"] = p.skipped_iterations;
  if (opt_ && opt_->grad_scaler().active()) {
    const optim::GradScalerState s = opt_->grad_scaler().state();
    state["grad_scaler"] = {
        {"scale", s.scale}, {"growth_tracker", s.growth_tracker}, {"hysteresis_tracker", s.hysteresis_tracker}};
  }
  return state;
}

std::string CheckpointSaver::save(const Progress& prog) {
  MOE_CHECK(!c_.save.empty(), "no --save directory to save a checkpoint to");
  finish_async();  // a save in flight becomes visible before the next one starts
  const double t0 = now_seconds();
  std::vector<Tensor> m, v;
  MOE_ASSERT(opt_ != nullptr);
  opt_->gather_moments(m, v);
  for (Tensor& t : m) t = t.to(Device::cpu());
  for (Tensor& t : v) t = t.to(Device::cpu());
  const OnHost host(reg_, model_, opt_);  // the f32 weights: the format stays the same under --bf16
  std::vector<ckpt::StoredTensor> mine;
  const auto& all = reg_.all();
  int64_t bytes = 0;
  for (size_t i = 0; i < all.size(); i++) {
    const nn::Parameter& p = *all[i];
    if (!stores(p)) continue;
    const ckpt::Box b = ckpt::box_of(p);
    mine.push_back({p.name, b, p.value});
    mine.push_back({"optimizer.exp_avg." + p.name, b, m[i]});
    mine.push_back({"optimizer.exp_avg_sq." + p.name, b, v[i]});
    bytes += 3 * static_cast<int64_t>(p.value.nbytes());
  }
  // The expert bias is replicated over TP x DP within a stage: its first rank writes each stage's layers.
  if ((g_.distributed() ? g_.tp_dp->rank() == 0 : true) && c_.moe_router_enable_expert_bias)
    for (auto* l : moe_layers(model_))
      mine.push_back(
          {expert_bias_name(*l), ckpt::whole_box(l->router().expert_bias().shape()), l->router().expert_bias()});
  std::vector<std::pair<std::string, std::string>> extra;
  if (vocab_.tokenizer &&
      g_.world_rank == 0) {  // the checkpoint carries its tokenizer: `moecore generate` needs nothing else
    extra.push_back({"tokenizer.json", vocab_.tokenizer->json_text()});
    if (const auto eos = vocab_.tokenizer->eos_id())  // what `moecore generate` reads of tokenizer_config.json
      extra.push_back(
          {"tokenizer_config.json", nlohmann::json{{"eos_token", vocab_.tokenizer->decode({*eos})}}.dump()});
  }
  ckpt::SaveFault fault;
  if (!c_.fault_kill_during_save.empty()) {
    const auto colon = c_.fault_kill_during_save.find(':');
    fault = {std::stoll(c_.fault_kill_during_save.substr(0, colon)),
             std::stoll(c_.fault_kill_during_save.substr(colon + 1))};
  }
  Tensor total = Tensor::empty({1}, DType::F64);
  total.set_item(0, static_cast<double>(bytes));
  if (g_.world) g_.world->all_reduce(total);
  if (c_.async_save) {
    // Snapshot at the step boundary (parameters and moments copied: training changes them from the next step),
    // then a background thread writes this rank's files; the commit is collective and comes later.
    auto a = std::make_unique<AsyncSave>();
    for (auto& t : mine) t.tensor = t.tensor.clone();
    a->mine = std::move(mine);
    a->state = train_state(prog);
    a->extra = std::move(extra);
    a->bytes = total.item(0);
    a->started = t0;
    a->pending = ckpt::begin_save(c_.save, prog.iteration, g_.world.get());
    a->pending.integrity = c_.verify_integrity;
    const int64_t rank = g_.world_rank;
    AsyncSave* raw = a.get();
    a->writer = std::thread([raw, rank, fault] {
      try {
        ckpt::write_rank_files(raw->pending, rank, raw->mine, fault);
      } catch (const std::exception& e) {
        raw->error = e.what();
      }
      raw->done = true;
    });
    async_ = std::move(a);
    fmt::print(out_, " saving checkpoint at iteration {} to {} in the background ({}, snapshot in {:.2f} s)\n",
               prog.iteration, async_->pending.final_dir, human_bytes(async_->bytes), now_seconds() - t0);
    flush_checked(out_, "training log");
    last_saved_ = prog.iteration;
    return async_->pending.final_dir;
  }
  const std::string dir = ckpt::save_checkpoint(c_.save, prog.iteration, mine, train_state(prog), g_.world.get(), extra,
                                                fault, c_.verify_integrity);
  const double secs = now_seconds() - t0;
  fmt::print(out_, " saved checkpoint at iteration {} to {} ({} in {:.2f} s)\n", prog.iteration, dir,
             human_bytes(total.item(0)), secs);
  flush_checked(out_, "training log");
  last_saved_ = prog.iteration;
  retain_after_save(prog.iteration);
  return dir;
}

void CheckpointSaver::finish_async() {
  if (!async_) return;
  std::unique_ptr<AsyncSave> a = std::move(async_);
  const double t_wait = now_seconds();
  if (a->writer.joinable()) a->writer.join();
  const double waited = now_seconds() - t_wait;
  // Every rank learns whether any rank's write failed, so all commit or none does.
  Tensor failed = Tensor::empty({1}, DType::F64);
  failed.set_item(0, a->error.empty() ? 0.0 : 1.0);
  if (g_.world) g_.world->all_reduce(failed);
  if (failed.item(0) > 0) {
    ckpt::abandon_save(a->pending, g_.world_rank);
    last_saved_ = written_.empty() ? -1 : written_.back();
    MOE_CHECK(a->error.empty(), "the background save of iteration {} failed: {}", a->pending.iteration, a->error);
    MOE_CHECK(false, "the background save of iteration {} failed on another rank (its message names the file)",
              a->pending.iteration);
  }
  ckpt::commit_save(a->pending, a->state, g_.world.get(), a->extra);
  fmt::print(out_,
             " saved checkpoint at iteration {} to {} ({} in the background, {:.2f} s after the snapshot; "
             "training waited {:.2f} s for it here)\n",
             a->pending.iteration, a->pending.final_dir, human_bytes(a->bytes), now_seconds() - a->started, waited);
  flush_checked(out_, "training log");
  retain_after_save(a->pending.iteration);
}

CheckpointSaver::~CheckpointSaver() {
  // Unwinding from an error: the writer is joined (its files stay in the .tmp directory, never loaded).
  if (async_ && async_->writer.joinable()) async_->writer.join();
}

void CheckpointSaver::retain_after_save(int64_t iteration) {
  if (written_.empty() || written_.back() != iteration) written_.push_back(iteration);
  const int64_t N = c_.save_retain_interval, K = c_.keep_last_checkpoints;
  if (N <= 0 && K <= 0) return;
  std::vector<int64_t> drop, keep;
  const int64_t n = static_cast<int64_t>(written_.size());
  for (int64_t i = 0; i < n; i++) {
    const int64_t it = written_[static_cast<size_t>(i)];
    // The newest stays; iteration 0 stays (as Megatron's prev_iteration > 0); multiples of N stay; the newest K
    // this run wrote stay.
    const bool stays = i == n - 1 || it == 0 || (N > 0 && it % N == 0) || (K > 0 && i >= n - K);
    (stays ? keep : drop).push_back(it);
  }
  written_ = keep;
  if (g_.world_rank == 0 && !drop.empty()) {
    ckpt::delete_checkpoints(c_.save, drop);
    fmt::print(out_, " deleted checkpoint(s) {} of this run ({}{})\n", fmt::join(drop, ", "),
               N > 0 ? fmt::format("--save-retain-interval {}", N) : "",
               K > 0 ? fmt::format("{}--keep-last-checkpoints {}", N > 0 ? ", " : "", K) : "");
  }
}

void CheckpointSaver::start_at(const Progress& p) {
  last_saved_ = p.iteration;
  run_start_iteration_ = p.iteration;
  run_start_consumed_ = p.cursor.consumed_samples;
}

int64_t CheckpointSaver::checkpoint_bytes() const {
  // Parameters and both Adam moments in fp32, over the whole (global) model; the expert bias is negligible.
  int64_t n = 0;
  for (const auto& p : reg_.all()) n += ckpt::box_of(*p).global.numel();
  return 3 * 4 * n;
}

void CheckpointSaver::check_save_target() const {
  if (!c_.save.empty() && opt_) ckpt::check_save_directory(c_.save, checkpoint_bytes(), g_.world_rank);
}

}  // namespace moecore::train
