// Saving and loading the training state (see checkpointing.h).
#include "moecore/train/checkpointing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "moecore/ckpt/upcycling.h"
#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/core/timer.h"
#include "moecore/data/preprocess.h"

namespace moecore::train {

namespace {
// Checkpoints read and write the parameters and the router state on the host: a model training on a GPU is copied
// to the host for a save or a load and back after it (the same bits either way; the moments are copied by save).
class OnHost {
 public:
  OnHost(nn::ParamRegistry& reg, nn::GPTModel& model) : reg_(reg), model_(model), dev_(reg.device()) {
    if (dev_.is_cuda()) move(Device::cpu());
  }
  ~OnHost() {
    if (!dev_.is_cuda()) return;
    try {
      move(dev_);
    } catch (...) {  // an error already on its way out says more than a failed copy back
    }
  }
  OnHost(const OnHost&) = delete;
  OnHost& operator=(const OnHost&) = delete;

 private:
  void move(Device d) {
    reg_.to(d);
    for (auto* l : moe_layers(model_)) l->router().expert_bias() = l->router().expert_bias().to(d);
  }
  nn::ParamRegistry& reg_;
  nn::GPTModel& model_;
  Device dev_;
};

std::string expert_bias_name(moe::MoELayer& l) {
  const std::string& w = l.router().weight().name;  // ...mlp.router.weight
  return w.substr(0, w.size() - std::string("weight").size()) + "expert_bias";
}
ckpt::Box whole(const Tensor& t) {
  return ckpt::whole_box(t.shape());
}
// "--flag: saved in the checkpoint, here" lines for the flags of `keys` whose values differ.
template <typename Keys>
std::string flag_differences(const nlohmann::json& saved, const nlohmann::json& here, const Keys& keys,
                             const char* where) {
  std::string out;
  for (const auto& key : keys) {
    const std::string k = key;
    if (saved.contains(k) && saved[k] != here[k])
      out += fmt::format("\n  --{}: {} in {}, {} here", k, saved[k].dump(), where, here[k].dump());
  }
  return out;
}
// Megatron's OptimizerParamScheduler.state_dict (steps in samples).
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
// Megatron's load_state_dict (_check_and_set per value): --override-opt_param-scheduler keeps the flags' values,
// --use-checkpoint-opt_param-scheduler takes the checkpoint's, neither requires them equal (the differences are
// returned). Deliberately looser than Megatron: the weight-decay length is compared only when a weight-decay
// increase uses it, so a constant-weight-decay run may be extended with a larger --train-iters.
std::string load_scheduler(const nlohmann::json& sd, const TrainConfig& c, optim::LRSchedule& s) {
  std::string diff;
  auto check = [&](auto& mine, const char* key, const char* flags) {
    using V = std::decay_t<decltype(mine)>;
    const V saved = sd.at(key).get<V>();
    if (c.override_opt_param_scheduler) return;
    if (!c.use_checkpoint_opt_param_scheduler && saved != mine)
      diff += fmt::format("\n  {}: {} in the checkpoint, {} here", flags, saved, mine);
    mine = saved;
  };
  check(s.max_lr, "max_lr", "--lr");
  check(s.min_lr, "min_lr", "--min-lr");
  check(s.warmup_iters, "lr_warmup_steps", "warmup samples (--lr-warmup-iters x batch, -samples or -fraction)");
  check(s.decay_iters, "lr_decay_steps", "decay samples (--lr-decay-iters x batch or --lr-decay-samples)");
  check(s.style, "lr_decay_style", "--lr-decay-style");
  check(s.start_wd, "start_wd", "--start-weight-decay (or --weight-decay)");
  check(s.end_wd, "end_wd", "--end-weight-decay (or --weight-decay)");
  check(s.wd_incr_style, "wd_incr_style", "--weight-decay-incr-style");
  if (s.wd_incr_style != "constant" || sd.at("wd_incr_style").get<std::string>() != "constant")
    check(s.wd_incr_steps, "wd_incr_steps", "weight-decay samples (--train-iters x batch or --train-samples)");
  return diff;
}
bool is_vocab_parameter(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}
}  // namespace

bool Checkpointing::stores(const nn::Parameter& p) const {
  if (!g_.distributed()) return true;
  // The last pipeline stage's copy of the tied word embedding: the first stage writes it (every tensor once).
  if (g_.pp_rank > 0 && p.name == "embedding.word_embeddings.weight") return false;
  if (p.expert_parallel) return g_.edp->rank() == 0;
  return g_.dp->rank() == 0 && (p.tensor_parallel || g_.tp->rank() == 0);
}

void Checkpointing::refresh_master() {
  if (opt_) opt_->refresh_master();
}

std::vector<ckpt::LoadTarget> Checkpointing::load_targets(bool optimizer, std::vector<Tensor>& m,
                                                          std::vector<Tensor>& v) {
  std::vector<ckpt::LoadTarget> t;
  const auto& all = reg_.all();
  for (auto& p : all)
    t.push_back({p->name, ckpt::box_of(*p), &p->value, is_vocab_parameter(p->name) ? vocab_.size : 0});
  if (c_.moe_router_enable_expert_bias)
    for (auto* l : moe_layers(model_))
      t.push_back({expert_bias_name(*l), whole(l->router().expert_bias()), &l->router().expert_bias()});
  if (optimizer) {
    m.clear();
    v.clear();
    for (auto& p : all) {
      m.push_back(Tensor::empty(p->value.shape(), DType::F32));
      v.push_back(Tensor::empty(p->value.shape(), DType::F32));
    }
    for (size_t i = 0; i < all.size(); i++) {
      const int64_t vr = is_vocab_parameter(all[i]->name) ? vocab_.size : 0;
      t.push_back({"optimizer.exp_avg." + all[i]->name, ckpt::box_of(*all[i]), &m[i], vr});
      t.push_back({"optimizer.exp_avg_sq." + all[i]->name, ckpt::box_of(*all[i]), &v[i], vr});
    }
  }
  return t;
}

nlohmann::json Checkpointing::train_state(const Progress& p) const {
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
  return {{"format", ckpt::kTrainStateFormat},
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
}

std::string Checkpointing::save(const Progress& prog) {
  MOE_CHECK(!c_.save.empty(), "no --save directory to save a checkpoint to");
  finish_async();  // a save in flight becomes visible before the next one starts
  const double t0 = now_seconds();
  std::vector<Tensor> m, v;
  MOE_ASSERT(opt_ != nullptr);
  opt_->gather_moments(m, v);
  for (Tensor& t : m) t = t.to(Device::cpu());
  for (Tensor& t : v) t = t.to(Device::cpu());
  const OnHost host(reg_, model_);
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
      mine.push_back({expert_bias_name(*l), whole(l->router().expert_bias()), l->router().expert_bias()});
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
  const std::string dir =
      ckpt::save_checkpoint(c_.save, prog.iteration, mine, train_state(prog), g_.world.get(), extra, fault);
  const double secs = now_seconds() - t0;
  fmt::print(out_, " saved checkpoint at iteration {} to {} ({} in {:.2f} s)\n", prog.iteration, dir,
             human_bytes(total.item(0)), secs);
  flush_checked(out_, "training log");
  last_saved_ = prog.iteration;
  retain_after_save(prog.iteration);
  return dir;
}

void Checkpointing::finish_async() {
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

Checkpointing::~Checkpointing() {
  // Unwinding from an error: the writer is joined (its files stay in the .tmp directory, never loaded).
  if (async_ && async_->writer.joinable()) async_->writer.join();
}

void Checkpointing::retain_after_save(int64_t iteration) {
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

void Checkpointing::load_checkpoint(const std::string& dir, const nlohmann::json& state, Progress& p) {
  const std::string where = dir + "/" + ckpt::kStateFile;
  MOE_CHECK(state.contains("config") && state["config"].is_object(), "{} has no configuration", where);
  const nlohmann::json& saved = state["config"];
  const nlohmann::json here = config_json(c_);
  const std::string model_diff = flag_differences(saved, here, flag_names(kIdentity), "the checkpoint");
  if (!c_.finetune) {
    MOE_CHECK(model_diff.empty(),
              "{} holds a different model:{}\npass the checkpoint's values to resume it (or --finetune to start a new "
              "run from its weights)",
              dir, model_diff);
    // The scheduler state, as Megatron loads it (with the optimizer: not under --no-load-optim). A checkpoint from
    // before it was saved: the state its configuration gives.
    if (!c_.no_load_optim && !state.value("release", false)) {
      nlohmann::json sd;
      if (state.contains("opt_param_scheduler")) {
        sd = state["opt_param_scheduler"];
      } else {
        TrainConfig old = c_;
        apply_config_json(old, saved, where);
        sd = scheduler_state(lr_schedule(old), state.at("consumed_samples").get<int64_t>());
      }
      std::string sched_diff;
      try {
        sched_diff = load_scheduler(sd, c_, p.schedule);
        p.schedule_steps = sd.at("num_steps").get<int64_t>();
      } catch (const nlohmann::json::exception& e) {
        MOE_CHECK(false, "{}: field 'opt_param_scheduler' is malformed ({})", where, e.what());
      }
      MOE_CHECK(sched_diff.empty(),
                "{} was trained with a different learning-rate schedule:{}\npass the same values to resume it, "
                "--use-checkpoint-opt_param-scheduler to take the checkpoint's, --override-opt_param-scheduler to "
                "take these flags', or --finetune to start a new schedule from its weights",
                dir, sched_diff);
    }
  } else if (!model_diff.empty()) {
    fmt::print(out_, "note: --finetune from a checkpoint whose model flags differ:{}\n", model_diff);
  }
  const bool has_optim = state.value("optimizer", false);
  const bool optim = has_optim && !c_.finetune && !c_.no_load_optim && opt_;
  if (optim) {  // Adam moments, an SGD momentum and a Muon momentum are not interchangeable
    auto kind = [](const std::string& o) { return o == "dist_muon" ? std::string("muon") : o; };
    const std::string was = saved.contains("optimizer") ? saved["optimizer"].get<std::string>() : "adam";
    MOE_CHECK(kind(was) == kind(c_.optimizer),
              "{} holds {} optimizer state and this run uses --optimizer {}: pass --optimizer {} to resume it, or "
              "--no-load-optim to load the weights and start the {} state afresh",
              dir, was, c_.optimizer, was, c_.optimizer);
  }
  std::vector<Tensor> m, v;
  ckpt::load_tensors(dir, load_targets(optim, m, v));
  if (optim)
    opt_->load_moments(m, v);  // the sharded master weights re-read from the loaded parameters
  else
    refresh_master();
  const bool release = state.value("release", false);  // a converted model: weights only
  if (!c_.finetune && !release) {
    p.iteration = state.at("iteration").get<int64_t>();
    p.cursor.consumed_samples = state.at("consumed_samples").get<int64_t>();
    p.sums = IntervalSums::from_json(state.at("log_interval_sums"));
    if (!c_.no_load_rng) {
      const auto& counts = state.at("rng").at("router_forward_counts");
      for (auto* l : moe_layers(model_)) {
        const std::string& n = l->router().weight().name;
        MOE_CHECK(counts.contains(n), "{}: no RNG state for {} (pass --no-load-rng to start its noise afresh)", where,
                  n);
        l->router().forward_count() = counts[n].get<uint64_t>();
      }
    }
  }
  last_saved_ = p.iteration;
  run_start_iteration_ = p.iteration;
  run_start_consumed_ = p.cursor.consumed_samples;
  loaded_from_ = dir;
  fmt::print(out_, " loaded checkpoint {}: iteration {}, consumed samples {}, {}\n", dir, p.iteration,
             p.cursor.consumed_samples,
             optim       ? "optimizer state restored"
             : release   ? "a converted model (weights only)"
             : has_optim ? (c_.finetune ? "weights only (--finetune)" : "optimizer state not loaded (--no-load-optim)")
                         : "the checkpoint has no optimizer state: Adam moments start at zero");
}

void Checkpointing::load_hf(ckpt::HFModel& m) {
  const std::string& dir = m.dir();
  struct Target {
    Tensor* value;
    ckpt::Box box;  // this rank's part of the global tensor
  };
  std::map<std::string, Target> mine;
  for (auto& p : reg_.all()) mine[p->name] = {&p->value, ckpt::box_of(*p)};
  if (c_.moe_router_enable_expert_bias)  // DeepSeek-V3's e_score_correction_bias: router state, not a parameter
    for (auto* l : moe_layers(model_))
      mine[expert_bias_name(*l)] = {&l->router().expert_bias(), whole(l->router().expert_bias())};
  std::string problems;
  for (const auto& t : ckpt::native_tensors(m.architecture())) {
    const auto it = mine.find(t.name);
    if (it == mine.end()) {  // under pipeline parallelism: another stage's
      if (c_.pipeline_model_parallel_size == 1)
        problems += fmt::format("\n  {} (from {}) has no place in this model", t.name, t.pieces.front().hf_name);
      continue;
    }
    const Target& p = it->second;
    if (!(p.box.global == t.global)) {
      problems += fmt::format("\n  {}: {} in the HF model, {} here", t.name, t.global.str(), p.box.global.str());
      mine.erase(it);
      continue;
    }
    m.read_into(t, *p.value, p.box);  // only the HF pieces this rank holds part of
    mine.erase(it);
  }
  for (const auto& [name, p] : mine) problems += fmt::format("\n  {}: not in the HF model", name);
  MOE_CHECK(problems.empty(),
            "--load-hf {}: the model built from these flags does not match it:{}\n(drop the flags "
            "that change the architecture: --load-hf sets it from config.json)",
            dir, problems);
  refresh_master();
  loaded_from_ = dir;
  fmt::print(out_, " loaded HuggingFace {} model {}: weights only, iteration 0\n", m.architecture().kind, dir);
}

void Checkpointing::upcycle(const std::string& dir, const nlohmann::json& state) {
  const std::string where = dir + "/" + ckpt::kStateFile;
  const nlohmann::json& saved = state.at("config");
  MOE_CHECK(saved.value("num-experts", int64_t{0}) == 0,
            "--moe-use-upcycling: {} is already an MoE checkpoint (upcycling starts from a dense one)", dir);
  const nlohmann::json here = config_json(c_);
  const std::string diff =
      flag_differences(saved, here, flag_names(kIdentity, FlagGroup::Model), "the dense checkpoint");
  MOE_CHECK(diff.empty(), "--moe-use-upcycling: the non-MoE flags must match the dense model:{}", diff);
  // Everything outside the MoE layers' mlp loads as it is.
  std::vector<std::string> moe_prefixes;
  for (auto* l : moe_layers(model_)) {
    const std::string& w = l->router().weight().name;  // decoder.layers.N.mlp.router.weight
    moe_prefixes.push_back(w.substr(0, w.size() - std::string("router.weight").size()));
  }
  auto in_moe = [&](const std::string& name) {
    for (const auto& p : moe_prefixes)
      if (name.rfind(p, 0) == 0) return true;
    return false;
  };
  std::vector<ckpt::LoadTarget> targets;
  for (auto& p : reg_.all())
    if (!in_moe(p->name))
      targets.push_back({p->name, ckpt::box_of(*p), &p->value, is_vocab_parameter(p->name) ? vocab_.size : 0});
  ckpt::load_tensors(dir, targets);
  // Each MoE layer from its dense FFN (ckpt/upcycling).
  const int64_t g = c_.moe_upcycling_granularity, E = c_.num_experts, r = E / g, H = c_.hidden_size;
  const int64_t F = c_.ffn_hidden_size;
  const double s =
      ckpt::upcycling_scale(E, g, c_.moe_router_topk, c_.moe_router_pre_softmax, c_.swiglu || c_.squared_relu);
  const int64_t halves = c_.swiglu ? 2 : 1;
  for (const std::string& pre : moe_prefixes) {
    // The dense fc1 is stored as [2, F, H] (gated) or [F, H]: a whole box of either has the same bytes.
    Tensor d1 = Tensor::empty({halves, F, H}, DType::F32), d2 = Tensor::empty({H, F}, DType::F32);
    Tensor d1_view = c_.swiglu ? d1 : d1.reshape({F, H});
    ckpt::load_tensors(
        dir, {{pre + "linear_fc1.weight", whole(d1_view), &d1_view}, {pre + "linear_fc2.weight", whole(d2), &d2}});
    auto [e1, e2] = ckpt::upcycle_experts(d1, d2, E, g, s);
    nn::Parameter& fc1 = reg_.get(pre + "experts.linear_fc1.weight");
    nn::Parameter& fc2 = reg_.get(pre + "experts.linear_fc2.weight");
    Tensor e1_view = c_.swiglu ? e1 : e1.reshape({E, F / g, H});
    ckpt::copy_intersection(e1_view, whole(e1_view), fc1.value, ckpt::box_of(fc1));
    ckpt::copy_intersection(e2, whole(e2), fc2.value, ckpt::box_of(fc2));
    ckpt::tie_router_rows(reg_.get(pre + "router.weight").value, g);  // replicated, initialized by global index
  }
  refresh_master();
  loaded_from_ = dir;
  fmt::print(out_,
             " upcycled the dense checkpoint {} into {} experts per MoE layer (granularity {}, {} replicas, "
             "weights scaled by {:.4f})\n",
             dir, E, g, r, s);
}

int64_t Checkpointing::checkpoint_bytes() const {
  // Parameters and both Adam moments in fp32, over the whole (global) model; the expert bias is negligible.
  int64_t n = 0;
  for (const auto& p : reg_.all()) n += ckpt::box_of(*p).global.numel();
  return 3 * 4 * n;
}

void Checkpointing::check_save_target() {
  if (!c_.save.empty() && opt_) ckpt::check_save_directory(c_.save, checkpoint_bytes(), g_.world_rank);
}

void Checkpointing::load_at_start(StartPoint& start, Progress& p) {
  const OnHost host(reg_, model_);
  for (const std::string& line : start.set_aside) fmt::print(out_, "note: {}\n", line);
  if (start.checkpoint && !start.checkpoint->note.empty()) fmt::print(out_, "note: {}\n", start.checkpoint->note);
  if (c_.moe_use_upcycling) {
    // Once the upcycled model is saved, later runs resume it from --save (as Megatron does).
    if (const auto own = ckpt::find_checkpoint(c_.save)) {
      if (!own->note.empty()) fmt::print(out_, "note: {}\n", own->note);
      load_checkpoint(own->dir, own->state, p);
      check_save_target();
      return;
    }
    MOE_CHECK(start.checkpoint, "--moe-use-upcycling: --load {} holds no dense checkpoint", c_.load);
    upcycle(start.checkpoint->dir, start.checkpoint->state);
    check_save_target();
    save(p);
    return;
  }
  check_save_target();
  if (!c_.load.empty()) {
    if (start.checkpoint) {
      load_checkpoint(start.checkpoint->dir, start.checkpoint->state, p);
      return;
    }
    MOE_CHECK(!c_.finetune, "--finetune: --load {} holds no checkpoint (no {} and no index.json)", c_.load,
              ckpt::kLatestFile);
    if (c_.load_hf.empty())
      fmt::print(out_, "note: --load {} holds no checkpoint (no {}): training starts from scratch\n", c_.load,
                 ckpt::kLatestFile);
  }
  if (start.hf) {
    load_hf(*start.hf);
    start.hf.reset();  // its open files
  }
}

StartPoint find_start_point(const TrainConfig& c, const comm::ProcessGroup* world) {
  StartPoint s;
  if (!c.load.empty()) s.checkpoint = ckpt::find_checkpoint(c.load, c.ckpt_step);
  if (!c.save.empty()) {
    // Before anything is built: a save must never replace complete checkpoints this run did not load. Upcycling
    // resumes from --save once that holds its checkpoint.
    const auto loaded = c.moe_use_upcycling ? ckpt::find_checkpoint(c.save) : s.checkpoint;
    int64_t from = -1;
    if (loaded) {
      const bool restart = c.finetune || loaded->state.value("release", false);
      from = restart ? 0 : loaded->state.at("iteration").get<int64_t>();
    }
    // A save killed before its commit (the marker's update) is set aside, so training goes on from the marker.
    s.set_aside = ckpt::set_aside_uncommitted_saves(c.save, from, loaded ? loaded->dir : "", world);
    ckpt::check_save_overwrites(c.save, from, loaded ? loaded->dir : "");
  }
  if (s.checkpoint && s.checkpoint->state.contains("vocab"))
    s.vocab_rows = s.checkpoint->state["vocab"].value("padded", int64_t{0});
  if (!s.checkpoint && !c.load_hf.empty()) {
    s.hf = std::make_unique<ckpt::HFModel>(c.load_hf);
    s.vocab_rows = s.hf->architecture().vocab;
  }
  return s;
}

Checkpointing::Checkpointing(const TrainConfig& c, std::FILE* out, const ParallelGroups& g, const Vocabulary& vocab,
                             nn::ParamRegistry& reg, nn::GPTModel& model, optim::ChainedOptimizer* opt)
    : c_(c), out_(out), g_(g), vocab_(vocab), reg_(reg), model_(model), opt_(opt) {}

}  // namespace moecore::train
