// Loading at start-up (see checkpoint_load.h).
#include "moecore/train/checkpoint_load.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "moecore/ckpt/upcycling.h"
#include "moecore/core/error.h"

namespace moecore::train {

namespace {
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

// One start-up's loading: into the model and optimizer of the state, telling the saver (when there is one) where
// the run starts.
class CheckpointLoader : CheckpointedState {
 public:
  CheckpointLoader(const CheckpointedState& state, CheckpointSaver* saver) : CheckpointedState(state), saver_(saver) {}
  void load(StartPoint& start, Progress& p);
  const std::string& loaded_from() const { return loaded_from_; }

 private:
  void load_checkpoint(const std::string& dir, const nlohmann::json& state, Progress& p);
  void load_hf(ckpt::HFModel& m);
  // --moe-use-upcycling: this MoE model from the dense checkpoint in `dir` (reference §1.14).
  void upcycle(const std::string& dir, const nlohmann::json& state);
  // Load targets for the model (parameters, expert-bias buffers) and, when `optimizer`, the Adam moments into
  // `m`/`v` (allocated here).
  std::vector<ckpt::LoadTarget> load_targets(bool optimizer, std::vector<Tensor>& m, std::vector<Tensor>& v);

  CheckpointSaver* saver_;
  std::string loaded_from_;
};
}  // namespace

std::vector<ckpt::LoadTarget> CheckpointLoader::load_targets(bool optimizer, std::vector<Tensor>& m,
                                                             std::vector<Tensor>& v) {
  std::vector<ckpt::LoadTarget> t;
  const auto& all = reg_.all();
  for (auto& p : all)
    t.push_back({p->name, ckpt::box_of(*p), &p->value, is_vocab_parameter(p->name) ? vocab_.size : 0});
  if (c_.moe_router_enable_expert_bias)
    for (auto* l : moe_layers(model_))
      t.push_back(
          {expert_bias_name(*l), ckpt::whole_box(l->router().expert_bias().shape()), &l->router().expert_bias()});
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

void CheckpointLoader::load_checkpoint(const std::string& dir, const nlohmann::json& state, Progress& p) {
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
  if (optim) opt_->load_moments(m, v);  // the weights reach the optimizer's masters at OnHost::commit
  if (optim && state.contains("grad_scaler") && opt_->grad_scaler().active()) {  // Megatron's, with the optimizer's
    const nlohmann::json& s = state["grad_scaler"];
    opt_->grad_scaler().load(
        {s.at("scale").get<float>(), s.at("growth_tracker").get<int64_t>(), s.at("hysteresis_tracker").get<int64_t>()});
  }
  const bool release = state.value("release", false);  // a converted model: weights only
  if (!c_.finetune && !release) {
    p.iteration = state.at("iteration").get<int64_t>();
    p.cursor.consumed_samples = state.at("consumed_samples").get<int64_t>();
    p.sums = IntervalSums::from_json(state.at("log_interval_sums"));
    p.skipped_iterations = state.value("skipped_iterations", int64_t{0});
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
  if (saver_) saver_->start_at(p);
  loaded_from_ = dir;
  fmt::print(out_, " loaded checkpoint {}: iteration {}, consumed samples {}, {}\n", dir, p.iteration,
             p.cursor.consumed_samples,
             optim       ? "optimizer state restored"
             : release   ? "a converted model (weights only)"
             : has_optim ? (c_.finetune ? "weights only (--finetune)" : "optimizer state not loaded (--no-load-optim)")
                         : "the checkpoint has no optimizer state: Adam moments start at zero");
}

void CheckpointLoader::load_hf(ckpt::HFModel& m) {
  const std::string& dir = m.dir();
  struct Target {
    Tensor* value;
    ckpt::Box box;  // this rank's part of the global tensor
  };
  std::map<std::string, Target> mine;
  for (auto& p : reg_.all()) mine[p->name] = {&p->value, ckpt::box_of(*p)};
  if (c_.moe_router_enable_expert_bias)  // DeepSeek-V3's e_score_correction_bias: router state, not a parameter
    for (auto* l : moe_layers(model_))
      mine[expert_bias_name(*l)] = {&l->router().expert_bias(), ckpt::whole_box(l->router().expert_bias().shape())};
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
  loaded_from_ = dir;
  fmt::print(out_, " loaded HuggingFace {} model {}: weights only, iteration 0\n", m.architecture().kind, dir);
}

void CheckpointLoader::upcycle(const std::string& dir, const nlohmann::json& state) {
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
  const int64_t g = c_.moe_upcycling_granularity, E = c_.num_experts, r = E / g;
  const double s =
      ckpt::upcycling_scale(E, g, c_.moe_router_topk, c_.moe_router_pre_softmax, c_.swiglu || c_.squared_relu);
  const ckpt::DenseFFN dense{c_.ffn_hidden_size, c_.hidden_size, c_.swiglu};
  for (const std::string& pre : moe_prefixes)
    ckpt::upcycle_layer(dir, pre, dense, g, s, reg_.get(pre + "experts.linear_fc1.weight"),
                        reg_.get(pre + "experts.linear_fc2.weight"), reg_.get(pre + "router.weight").value);
  loaded_from_ = dir;
  fmt::print(out_,
             " upcycled the dense checkpoint {} into {} experts per MoE layer (granularity {}, {} replicas, "
             "weights scaled by {:.4f})\n",
             dir, E, g, r, s);
}

void CheckpointLoader::load(StartPoint& start, Progress& p) {
  // Every loader writes whole f32 weights on the host; commit hands them to the optimizer. Made only where something
  // loads: a fresh start keeps its (possibly sharded, never whole: --init-model-with-meta-device) initial weights.
  std::optional<OnHost> host;
  auto on_host = [&]() -> OnHost& {
    if (!host) host.emplace(reg_, model_, opt_);
    return *host;
  };
  for (const std::string& line : start.set_aside) fmt::print(out_, "note: {}\n", line);
  if (start.checkpoint && !start.checkpoint->note.empty()) fmt::print(out_, "note: {}\n", start.checkpoint->note);
  if (c_.moe_use_upcycling) {
    // Once the upcycled model is saved, later runs resume it from --save (as Megatron does).
    if (const auto own = ckpt::find_checkpoint(c_.save)) {
      if (!own->note.empty()) fmt::print(out_, "note: {}\n", own->note);
      on_host();
      load_checkpoint(own->dir, own->state, p);
      on_host().commit();
      if (saver_) saver_->check_save_target();
      return;
    }
    MOE_CHECK(start.checkpoint, "--moe-use-upcycling: --load {} holds no dense checkpoint", c_.load);
    on_host();
    upcycle(start.checkpoint->dir, start.checkpoint->state);
    on_host().commit();  // before the save below reads the weights back
    MOE_ASSERT(saver_ != nullptr);
    saver_->check_save_target();
    saver_->save(p);
    return;
  }
  if (saver_) saver_->check_save_target();
  if (!c_.load.empty()) {
    if (start.checkpoint) {
      on_host();
      load_checkpoint(start.checkpoint->dir, start.checkpoint->state, p);
      on_host().commit();
      return;
    }
    MOE_CHECK(!c_.finetune, "--finetune: --load {} holds no checkpoint (no {} and no index.json)", c_.load,
              ckpt::kLatestFile);
    if (c_.load_hf.empty())
      fmt::print(out_, "note: --load {} holds no checkpoint (no {}): training starts from scratch\n", c_.load,
                 ckpt::kLatestFile);
  }
  if (start.hf) {
    on_host();
    load_hf(*start.hf);
    start.hf.reset();  // its open files
    on_host().commit();
  }
}

std::string load_at_start(const CheckpointedState& state, StartPoint& start, Progress& p, CheckpointSaver* saver) {
  CheckpointLoader loader(state, saver);
  loader.load(start, p);
  return loader.loaded_from();
}

StartPoint find_start_point(const TrainConfig& c, const comm::ProcessGroup* world) {
  StartPoint s;
  if (!c.load.empty()) s.checkpoint = ckpt::find_checkpoint(c.load, c.ckpt_step);
  // --verify-integrity: every rank re-hashes the files, so the refusal comes identically on each before any work.
  if (s.checkpoint && c.verify_integrity) ckpt::verify_integrity_manifest(s.checkpoint->dir);
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

}  // namespace moecore::train
