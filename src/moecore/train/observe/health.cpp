// Numerical fault finding (see health.h).
#include "moecore/train/observe/health.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/train/pipeline/pipeline_schedule.h"

namespace moecore::train {

namespace {
// The sum of squares is accumulated in f64: finite for every finite f32/bf16 tensor, NaN or inf otherwise.
bool all_finite(const Tensor& t) {
  if (!t.defined()) return true;  // a tensor this rank does not hold now (Megatron FSDP's freed units): its owner's
  return std::isfinite(kernels::sum_squares(t));
}

// The smallest `ordinal` over all ranks, and the lowest rank holding it (none: numeric_limits max).
std::pair<double, int64_t> first_over_ranks(double ordinal, const comm::ProcessGroup* world) {
  if (!world || world->size() == 1) return {ordinal, 0};
  Tensor m = Tensor::empty({1}, DType::F64);  // the minimum as the maximum of negatives
  m.set_item(0, -ordinal);
  world->all_reduce(m, comm::ReduceOp::Max);
  const double best = -m.item(0);
  Tensor r = Tensor::empty({1}, DType::F64);
  r.set_item(0, ordinal == best ? -static_cast<double>(world->rank()) : -1e18);
  world->all_reduce(r, comm::ReduceOp::Max);
  return {best, static_cast<int64_t>(-r.item(0))};
}
// `text` of rank `root` on every rank of `world`.
std::string broadcast_text(const std::string& text, int64_t root, const comm::ProcessGroup& world) {
  Tensor n = Tensor::empty({1}, DType::F64);
  n.set_item(0, static_cast<double>(text.size()));
  world.broadcast(n, root);
  Tensor chars = Tensor::zeros({std::max<int64_t>(1, static_cast<int64_t>(n.item(0)))}, DType::F64);
  for (size_t i = 0; i < text.size() && world.rank() == root; i++)
    chars.set_item(static_cast<int64_t>(i), static_cast<unsigned char>(text[i]));
  world.broadcast(chars, root);
  std::string out(static_cast<size_t>(n.item(0)), ' ');
  for (size_t i = 0; i < out.size(); i++)
    out[i] = static_cast<char>(static_cast<int>(chars.item(static_cast<int64_t>(i))));
  return out;
}

// Whether every value `held` of each parameter is finite (a parameter held in several shards: all of them).
std::map<const nn::Parameter*, bool> held_finite(const std::vector<optim::HeldValues>& held) {
  std::map<const nn::Parameter*, bool> finite;
  for (const auto& h : held) {
    auto [it, fresh] = finite.emplace(h.p, true);
    it->second = it->second && all_finite(h.values);
  }
  return finite;
}
}  // namespace

void check_parameters_finite(const std::vector<optim::HeldValues>& held, const std::string& source,
                             const comm::ProcessGroup* world) {
  constexpr double kNone = std::numeric_limits<double>::max();
  double first = kNone;
  std::string what;
  for (size_t i = 0; i < held.size() && first == kNone; i++) {
    const optim::HeldValues& h = held[i];
    if (all_finite(h.values)) continue;
    first = static_cast<double>(i);
    const int64_t numel = h.p->value.shape().numel();
    const std::string shard = h.first > 0 || h.values.numel() < numel
                                  ? fmt::format(" in its elements [{}, {})", h.first, h.first + h.values.numel())
                                  : "";
    what = fmt::format("parameter {} {} holds NaN or infinite values{}", h.p->name, h.p->value.shape().str(), shard);
  }
  const auto [at, rank] = first_over_ranks(first, world);
  if (at == kNone) return;
  if (!world || world->size() == 1) MOE_CHECK(false, "{}: {}", source, what);
  MOE_CHECK(false, "{}: {} on rank {}", source, broadcast_text(what, rank, *world), rank);
}

std::string locate_nonfinite(nn::GPTModel& model, nn::GPTModel::Stash& stash, nn::ParamRegistry& reg,
                             const std::vector<optim::HeldValues>& held, const data::SampleSource& data,
                             const data::SampleCursor& cursor, const MicroBatches& mb,
                             const comm::ProcessGroup* world) {
  constexpr double kNone = std::numeric_limits<double>::max();
  // Every place is numbered in execution order, identically on every rank: parameters, then per micro-batch the
  // modules' outputs and gradients, then the parameter gradients.
  std::vector<std::string> places;
  double first = kNone;
  auto note = [&](std::string place, bool finite) {
    if (!finite && first == kNone) first = static_cast<double>(places.size());
    places.push_back(std::move(place));
  };
  const std::map<const nn::Parameter*, bool> values_finite = held_finite(held);
  auto value_finite = [&](const nn::Parameter& p) {
    const auto it = values_finite.find(&p);
    return it != values_finite.end() ? it->second : all_finite(p.value);
  };
  for (const auto& p : reg.all()) note(fmt::format("the parameter {} (its values)", p->name), value_finite(*p));
  int64_t micro = 0;
  const nn::Probe probe = [&](const std::string& where, bool backward, const Tensor& t) {
    note(fmt::format("{} {} (micro-batch {})", backward ? "the gradient passed down by" : "the forward output of",
                     where, micro),
         all_finite(t));
  };
  model.set_probe(&probe);
  reg.zero_grad();
  try {
    for (micro = 0; micro < mb.count; micro++) {
      stash.sample_B = cursor.micro_batch(micro, mb.dp_rank, mb.dp_size, mb.size);  // the step's dropout masks
      const data::Batch b = data::make_batch(data, stash.sample_B);
      model.forward(b.tokens, b.labels, b.loss_mask, stash);
      model.backward(stash, 1.0 / static_cast<double>(mb.count));
    }
  } catch (...) {
    model.set_probe(nullptr);
    throw;
  }
  model.set_probe(nullptr);
  for (const auto& p : reg.all()) note(fmt::format("the gradient of {}", p->name), all_finite(p->grad));
  const auto [at, rank] = first_over_ranks(first, world);
  if (at == kNone) return "the re-run of the step found every value finite (a fault that does not repeat)";
  if (!world || world->size() == 1) return places.at(static_cast<size_t>(at));
  // The place as the rank that found it names it (an expert's or a tensor-parallel shard's name is its own).
  const std::string mine = first == at ? places.at(static_cast<size_t>(at)) : "";
  return fmt::format("{} on rank {}", broadcast_text(mine, rank, *world), rank);
}

std::string locate_nonfinite_pipeline(nn::GPTModel& model, nn::ParamRegistry& reg,
                                      const std::vector<optim::HeldValues>& held, PipelineSchedule& schedule,
                                      const data::SampleSource& data, const data::SampleCursor& cursor,
                                      const MicroBatches& mb, const comm::ProcessGroup& world, int64_t pp_rank,
                                      int64_t pp_size) {
  // Each place gets a key, the same ordering on every rank: category (parameters, the passes, parameter
  // gradients), then for a pass its micro-batch, forward before backward, the model chunk's position in the model
  // (virtual stage c·P + rank; reversed in backward), and the place's ordinal within the pass or stage. At most 46
  // bits: exact in a double.
  auto key = [](uint64_t category, uint64_t micro, uint64_t backward, uint64_t position, uint64_t ordinal) {
    micro = std::min<uint64_t>(micro, (1u << 12) - 1), position = std::min<uint64_t>(position, (1u << 11) - 1);
    ordinal = std::min<uint64_t>(ordinal, (1u << 20) - 1);
    return static_cast<double>((((((category << 12) | micro) << 1 | backward) << 11 | position) << 20) | ordinal);
  };
  constexpr double kNone = std::numeric_limits<double>::max();
  double first = kNone;
  std::string first_place;
  auto note = [&](double k, const std::function<std::string()>& place, bool finite) {
    if (finite || k >= first) return;
    first = k;
    first_place = place();
  };
  const auto stage = static_cast<uint64_t>(pp_rank);
  uint64_t ordinal = 0;
  const std::map<const nn::Parameter*, bool> values_finite = held_finite(held);
  for (const auto& p : reg.all()) {
    const auto it = values_finite.find(p.get());
    note(
        key(0, 0, 0, stage, ordinal++), [&] { return fmt::format("the parameter {} (its values)", p->name); },
        it != values_finite.end() ? it->second : all_finite(p->value));
  }
  PipelinePass last{false, -1, -1};
  const auto stages = static_cast<uint64_t>(pp_size) * static_cast<uint64_t>(model.num_chunks());
  const nn::Probe probe = [&](const std::string& where, bool backward, const Tensor& t) {
    const PipelinePass& pass = schedule.current_pass();
    if (!(pass == last)) last = pass, ordinal = 0;
    const uint64_t vstage = static_cast<uint64_t>(pass.chunk * pp_size + pp_rank);
    note(
        key(1, static_cast<uint64_t>(pass.micro_batch), pass.forward ? 0 : 1,
            pass.forward ? vstage : stages - 1 - vstage, ordinal++),
        [&] {
          return fmt::format("{} {} (micro-batch {})",
                             backward ? "the gradient passed down by" : "the forward output of", where,
                             pass.micro_batch);
        },
        all_finite(t));
  };
  model.set_probe(&probe);
  reg.zero_grad();
  try {
    schedule.forward_backward(model, data, cursor, mb, nullptr);
  } catch (...) {
    model.set_probe(nullptr);
    throw;
  }
  model.set_probe(nullptr);
  ordinal = 0;
  for (const auto& p : reg.all())
    note(
        key(2, 0, 0, stage, ordinal++), [&] { return fmt::format("the gradient of {}", p->name); },
        all_finite(p->grad));
  const auto [at, rank] = first_over_ranks(first, &world);
  if (at == kNone) return "the re-run of the step found every value finite (a fault that does not repeat)";
  return fmt::format("{} on rank {} (pipeline stage {})", broadcast_text(first_place, rank, world), rank,
                     broadcast_text(std::to_string(pp_rank), rank, world));
}

void check_weight_hashes_across_dp(const nn::ParamRegistry& reg, const ParallelGroups& g, int64_t iteration) {
  for (const bool expert : {false, true}) {
    const comm::ProcessGroup* group = ParallelGroups::active(expert ? g.edp : g.dp);
    if (!group) continue;
    std::vector<const nn::Parameter*> ps;
    for (const auto& p : reg.all())
      if (p->expert_parallel == expert) ps.push_back(p.get());
    // Each hash as two 32-bit halves, exact in f64; equal on every replica iff max(h) == -max(-h).
    const auto n = static_cast<int64_t>(ps.size());
    Tensor hi = Tensor::empty({2 * n}, DType::F64), lo = Tensor::empty({2 * n}, DType::F64);
    for (int64_t i = 0; i < n; i++) {
      const Tensor w = ps[i]->value.to(Device::cpu());  // a GPU's weights are hashed from a host copy
      const uint64_t h = XXH3_64bits(w.raw(), w.nbytes());
      hi.set_item(i, static_cast<double>(h >> 32));
      hi.set_item(n + i, -static_cast<double>(h >> 32));
      lo.set_item(i, static_cast<double>(h & 0xffffffffu));
      lo.set_item(n + i, -static_cast<double>(h & 0xffffffffu));
    }
    group->all_reduce(hi, comm::ReduceOp::Max);
    group->all_reduce(lo, comm::ReduceOp::Max);
    for (int64_t i = 0; i < n; i++)
      MOE_CHECK(hi.item(i) == -hi.item(n + i) && lo.item(i) == -lo.item(n + i),
                "--check-weight-hash-across-dp-replicas-interval: at iteration {} the {} replicas of {} differ "
                "(their weights should be identical after every step); stopping",
                iteration, expert ? "expert-data-parallel" : "data-parallel", ps[i]->name);
  }
}

std::optional<std::string> StallAlarm::after_step(const StepResult& r) {
  zero_ = r.grad_norm == 0.0 ? zero_ + 1 : 0;
  uniform_ = std::fabs(r.lm_loss - log_vocab_) < 1e-4 ? uniform_ + 1 : 0;
  if (zero_ < n_ && uniform_ < n_) {
    warned_ = false;
    return std::nullopt;
  }
  if (warned_) return std::nullopt;
  warned_ = true;
  if (zero_ >= n_)
    return fmt::format(
        "warning: the gradient norm has been exactly 0 for {} steps: the model is not learning (all gradients "
        "vanished: check --lr, --init-method-std and the data's loss mask)",
        zero_);
  return fmt::format(
      "warning: the LM loss has equalled ln(vocabulary) = {:.4f} for {} steps: the logits are uniform, the model "
      "predicts nothing (a diverged run: lower --lr or raise --lr-warmup-iters)",
      log_vocab_, uniform_);
}

}  // namespace moecore::train
