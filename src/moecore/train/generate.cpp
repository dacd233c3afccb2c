// Sampling and the checkpoint model of `moecore generate` (see generate.h).
#include "moecore/train/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"
#include "moecore/core/rng.h"
#include "moecore/train/checkpoint_load.h"

namespace moecore::train {

std::string generate_text(nn::GPTModel& model, const data::Tokenizer& tok, int64_t vocab, const std::string& prompt,
                          const SamplingOptions& o) {
  std::vector<int32_t> ids = tok.encode(prompt);
  MOE_CHECK(!ids.empty(), "empty prompt");
  MOE_ASSERT(o.context > 0);
  const Philox rng(o.seed, stream_id("generate:" + prompt));
  const int64_t padded = model.config().vocab_size;
  model.set_training(false);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::vector<double> p;
  for (int64_t step = 0; step < o.tokens; step++) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - o.context);
    const int64_t len = static_cast<int64_t>(ids.size()) - start;
    Tensor t = Tensor::empty({1, len}, DType::I64);
    for (int64_t i = 0; i < len; i++) t.data<int64_t>()[i] = ids[static_cast<size_t>(start + i)];
    const Tensor logits = model.logits(t);  // [len, V_padded], row i = position i
    const float* row = logits.data<float>() + (len - 1) * padded;
    int32_t next = 0;
    if (o.temperature <= 0) {
      for (int64_t v = 1; v < vocab; v++)
        if (row[v] > row[next]) next = static_cast<int32_t>(v);
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      p.assign(static_cast<size_t>(k), 0.0);
      double z = 0;
      for (size_t i = 0; i < p.size(); i++) z += (p[i] = std::exp((row[order[i]] - row[order[0]]) / o.temperature));
      double u = rng.uniform(static_cast<uint64_t>(step)) * z;
      next = order[p.size() - 1];
      for (size_t i = 0; i < p.size(); i++) {
        u -= p[i];
        if (u <= 0) {
          next = order[i];
          break;
        }
      }
    }
    if (tok.eos_id() && next == *tok.eos_id()) break;
    ids.push_back(next);
  }
  model.set_training(true);
  return tok.decode(ids);
}

namespace {
// The checkpoint's configuration as a one-process, weights-only run with no data.
TrainConfig generation_config(const ckpt::FoundCheckpoint& found, const std::string& tokenizer_model) {
  const std::string state_file = found.dir + "/" + ckpt::kStateFile;
  MOE_CHECK(found.state.contains("config"), "{} has no configuration", state_file);
  const nlohmann::json& saved = found.state["config"];
  // What the model computes comes from the checkpoint (its model and MoE flags, and the GEMM precision);
  // layout, data, schedule and checkpoint flags keep their defaults: one process, weights only, no data.
  TrainConfig c;
  nlohmann::json model = nlohmann::json::object();
  const std::string& bf16 = flag_of(&TrainConfig::bf16).name;
  const std::string& fp16 = flag_of(&TrainConfig::fp16).name;
  const std::string& fp32_grads = flag_of(&TrainConfig::accumulate_allreduce_grads_in_fp32).name;
  const auto precision = [&](const std::string& n) { return n == bf16 || n == fp16 || n == fp32_grads; };
  for (const auto& f : flag_table())
    if ((f.group == FlagGroup::Model || f.group == FlagGroup::MoE || precision(f.name)) && saved.contains(f.name))
      model[f.name] = saved[f.name];
  apply_config_json(c, model, state_file);
  std::string trained_with = saved.value("tokenizer-type", std::string());
  if (trained_with.empty()) trained_with = "none";
  std::string tok = tokenizer_model;
  if (tok.empty() && std::filesystem::exists(found.dir + "/tokenizer.json")) tok = found.dir + "/tokenizer.json";
  MOE_CHECK(!tok.empty(), "{} has no tokenizer.json (it was trained with --tokenizer-type {}); pass --tokenizer-model",
            found.dir, trained_with);
  c.tokenizer_type = "HuggingFaceTokenizer";
  c.tokenizer_model = tok;
  c.mock_data = c.skip_train = true;  // no data, no training: no schedule either
  c.lr_decay_style = "constant";
  c.eval_iters = 0;
  c.load = found.dir;
  c.finetune = true;  // the weights only
  resolve(c);
  return c;
}
}  // namespace

CheckpointModel::CheckpointModel(const std::string& load, const std::string& tokenizer_model, Device device) {
  StartPoint start;
  start.checkpoint = ckpt::find_checkpoint(load);
  MOE_CHECK(start.checkpoint, "--load {} holds no checkpoint (no {} and no index.json)", load, ckpt::kLatestFile);
  c_ = generation_config(*start.checkpoint, tokenizer_model);
  dir_ = start.checkpoint->dir;
  if (start.checkpoint->state.contains("vocab"))
    start.vocab_rows = start.checkpoint->state["vocab"].value("padded", int64_t{0});
  groups_ = std::make_unique<ParallelGroups>(c_, nullptr);
  vocab_ = build_vocabulary(c_, start.vocab_rows);
  model_ = build_model(c_, vocab_.padded, reg_, *groups_);
  std::FILE* null = std::fopen("/dev/null", "w");  // what loading reports is for training runs
  MOE_CHECK(null != nullptr, "cannot open /dev/null");
  Progress p;
  try {
    load_at_start(CheckpointedState(c_, null, *groups_, vocab_, reg_, *model_, nullptr), start, p);
  } catch (...) {
    std::fclose(null);
    throw;
  }
  std::fclose(null);
  reg_.to(device);
  const auto& state = start.checkpoint->state;
  iteration_ = state.value("release", false) ? 0 : state.value("iteration", int64_t{0});
}

CheckpointModel::~CheckpointModel() = default;

std::string CheckpointModel::generate(const std::string& prompt, SamplingOptions o) {
  o.context = c_.seq_length;
  return generate_text(*model_, *vocab_.tokenizer, vocab_.size, prompt, o);
}

}  // namespace moecore::train
