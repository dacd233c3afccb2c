// Pipeline schedules (see pipeline_schedule.h).
#include "moecore/train/pipeline/pipeline_schedule.h"

#include <map>
#include <optional>

#include "moecore/core/error.h"
#include "moecore/core/timer.h"
#include "moecore/core/timers.h"
#include "moecore/train/pipeline/combined_1f1b.h"
#include "moecore/train/pipeline/pipeline_layout.h"

namespace moecore::train {

std::vector<std::pair<int64_t, int64_t>> pipeline_schedule_table(int64_t m, int64_t v, int64_t group) {
  std::vector<std::pair<int64_t, int64_t>> t;
  for (int64_t lo = 0; lo < m; lo += group) {
    const int64_t hi = lo + group >= m ? m : lo + group;  // the last group takes the rest
    for (int64_t c = 0; c < v; c++)
      for (int64_t i = lo; i < hi; i++) t.push_back({i, c});
    if (hi == m) break;
  }
  return t;
}

std::vector<PipelinePass> pipeline_order(int64_t m, int64_t P, int64_t rank, int64_t v, int64_t group,
                                         bool forward_only, bool combined) {
  MOE_ASSERT(m >= 1 && P >= 1 && rank >= 0 && rank < P && v >= 1);
  MOE_ASSERT_MSG(!combined || P == 1 || v > 1, "Megatron's combined 1F1B under pipelining needs virtual stages");
  if (v > 1) {  // Megatron's micro-batch rules for interleaving (checked before the first step too)
    PipelineLayout layout;
    layout.pp = P;
    layout.vpp = v;
    check_pipeline_microbatches(layout, m, group);
  }
  if (group <= 0) group = P;
  const int64_t total = m * v;
  int64_t warmup = 0;
  if (forward_only) {
    warmup = total;
  } else if (P > 1) {
    warmup = v == 1 ? P - rank - 1 : (P - rank - 1) * 2 + (v - 1) * group;
    // Megatron's extra warm-up forward with the combined schedule: without it the last stage's first steady pair
    // would merge a micro-batch's forward with its own backward.
    if (combined) warmup += 1;
  } else if (combined) {
    warmup = 1;  // combined_1f1b_schedule_for_no_pipelining: the first forward alone
  }
  warmup = std::min(warmup, total);
  const auto table = pipeline_schedule_table(m, v, group);
  MOE_ASSERT(static_cast<int64_t>(table.size()) == total);
  auto fwd = [&](int64_t k) { return PipelinePass{true, table[k].first, table[k].second}; };
  auto bwd = [&](int64_t k) { return PipelinePass{false, table[k].first, v - 1 - table[k].second}; };
  std::vector<PipelinePass> order;
  for (int64_t k = 0; k < warmup; k++) order.push_back(fwd(k));
  if (forward_only) return order;
  const int64_t remaining = total - warmup;
  for (int64_t k = 0; k < remaining; k++) {  // steady state: one forward, one backward
    order.push_back(fwd(k + warmup));
    order.back().merged = combined;
    order.push_back(bwd(k));
  }
  for (int64_t k = remaining; k < total; k++) order.push_back(bwd(k));  // cool-down
  return order;
}

// What one step's passes read: the micro-batches' samples and batches, the loss scales, the optimizer's hooks.
struct PipelineSchedule::Run {
  std::vector<std::vector<int64_t>> samples;
  std::vector<data::Batch> batches;
  bool per_token_loss = false;
  double global_tokens = 0, dp = 1, cp = 1;  // dp: DP×CP; cp: context-parallel size
  double loss_scale = 1;                     // the loss scaler's (schedule.h: MicroBatches::loss_scale)
  bool backward = false;                     // false: forward only
  bool merge = false;                        // run the order's merged pairs through combined_forward_backward
  optim::ChainedOptimizer* opt = nullptr;    // its gradient hooks (null: none, as in a re-run that locates a fault)
};

// What the passes of a step share: the stash of each (micro-batch, chunk) between its forward and backward, the loss.
struct PipelineSchedule::Live {
  explicit Live(const TokenScale& ts) : token_scale_of(ts) {}
  std::map<std::pair<int64_t, int64_t>, size_t> stash;  // (micro-batch, chunk) → its stash
  int64_t in_flight = 0;
  StepLoss loss;
  TokenScale token_scale_of;
};

PipelineSchedule::PipelineSchedule(const comm::ProcessGroup& pp, int64_t virtual_stages, int64_t group,
                                   const Shape& hidden, bool combined)
    : pp_(pp),
      v_(virtual_stages),
      group_(group > 0 ? group : pp.size()),
      combined_(combined),
      p2p_(pp, virtual_stages, hidden, DType::F32) {}

Tensor PipelineSchedule::receive(const PipelinePass& p, nn::GPTModel& model, double& waited) {
  const nn::ModelChunk& ch = model.chunk(static_cast<size_t>(p.chunk));
  if (p.forward ? ch.embedding : ch.loss) return Tensor();  // the tokens / the loss: nothing comes from a stage
  const double w0 = now_seconds();
  TimerScope timer(p.forward ? "forward-recv" : "backward-recv", 2);  // Megatron's level-2 timers
  Tensor t = p2p_.wait_recv(p.chunk, !p.forward);
  waited += now_seconds() - w0;
  return t;
}

void PipelineSchedule::forward_pass(nn::GPTModel& model, const PipelinePass& p, const Tensor& received, Run& r,
                                    Live& l) {
  current_ = p;
  const nn::ModelChunk& ch = model.chunk(static_cast<size_t>(p.chunk));
  const data::Batch& b = r.batches[static_cast<size_t>(p.micro_batch)];
  if (free_.empty()) {
    free_.push_back(stashes_.size());
    stashes_.push_back(model.make_stash());
  }
  const size_t s = free_.back();
  free_.pop_back();
  l.stash[{p.micro_batch, p.chunk}] = s;
  peak_in_flight_ = std::max(peak_in_flight_, ++l.in_flight);
  nn::GPTModel::Stash& st = stashes_[s];
  st.sample_B = r.samples[static_cast<size_t>(p.micro_batch)];
  st.tokens_BS = b.tokens;  // MTP on the loss chunk embeds the input ids
  const Tensor in = ch.embedding ? b.tokens : received;
  // With a backward to follow, its token scale (below) is known now: the loss's forward computes the logits'
  // gradient too (GPTModel::Stash).
  st.token_scale_of = nullptr;
  if (r.backward) st.token_scale_of = l.token_scale_of;
  std::optional<TimerScope> compute(std::in_place, "forward-compute", 2);
  const Tensor out = model.forward_chunk(static_cast<size_t>(p.chunk), in, st);
  if (ch.loss) {
    const double mean = model.loss_forward(b.labels, b.loss_mask, st);
    l.loss.sum += mean * st.mask_sum;
    l.loss.tokens += st.mask_sum;
  }
  compute.reset();
  if (!ch.loss) {
    TimerScope timer("forward-send", 2);
    p2p_.send(p.chunk, false, out);
  }
  if (!r.backward) {  // forward only: nothing to keep
    free_.push_back(s);
    l.stash.erase({p.micro_batch, p.chunk});
    l.in_flight--;
  }
}

void PipelineSchedule::backward_pass(nn::GPTModel& model, const PipelinePass& p, const Tensor& dy, Run& r, Live& l) {
  current_ = p;
  const nn::ModelChunk& ch = model.chunk(static_cast<size_t>(p.chunk));
  const data::Batch& b = r.batches[static_cast<size_t>(p.micro_batch)];
  const int64_t m = static_cast<int64_t>(r.batches.size());
  const auto it = l.stash.find({p.micro_batch, p.chunk});
  MOE_ASSERT(it != l.stash.end());
  nn::GPTModel::Stash& st = stashes_[it->second];
  const double token_scale = l.token_scale_of(st.mask_sum);
  double aux_scale = r.cp / static_cast<double>(m);
  if (r.per_token_loss)
    aux_scale = r.global_tokens > 0 ? static_cast<double>(b.tokens.numel()) * r.dp / r.global_tokens : 0.0;
  aux_scale *= r.loss_scale;
  optim::ChainedOptimizer* opt = r.opt;
  std::function<void(size_t)> hook;  // the chunk's last micro-batch: its layers' gradients are final
  if (opt && p.micro_batch == m - 1) hook = [opt](size_t layer) { opt->layer_grads_final(layer); };
  std::optional<TimerScope> compute(std::in_place, "backward-compute", 2);
  const Tensor dx = model.backward_chunk(static_cast<size_t>(p.chunk), st, dy, token_scale, aux_scale, hook);
  compute.reset();
  if (!ch.embedding) {
    TimerScope timer("backward-send", 2);
    p2p_.send(p.chunk, true, dx);
  }
  free_.push_back(it->second);
  l.stash.erase(it);
  l.in_flight--;
}

// A merged pair (combined 1F1B) as Megatron places its messages around it (model_chunk_schedule_plan.py
// TransformerModelChunkSchedulePlan.run: pre_forward and pre_backward wait for the two receives before the first
// layer, post_forward and post_backward send after the last): both receives are waited for before the pair starts,
// and each side sends (non-blocking) as soon as it has finished.
// Why the stages cannot deadlock: sends never block (they are waited for at the end of the step) and every
// receive is posted before the step that waits for it, so a rank only blocks at the start of a step, on a message a
// neighbour has yet to send. Merging adds one kind of dependency to the plain schedule's (acyclic: Megatron's
// 1F1B): a pair's sends now wait for both its receives, so its forward's output also waits for its backward's
// gradient. That gradient comes back from the next virtual stage's backward of the same micro-batch, which needs
// (through the loss) every forward of that micro-batch; a cycle therefore needs the gradient to depend on this
// pair's forward output, either directly (the pair's forward of the backward's micro-batch) or through another
// stage's pair. Megatron's extra warm-up forward (pipeline_order) rules out the first (asserted below), and
// tests/train/test_pipeline_combined.cpp rules out both exhaustively: it replays every rank's steps under exactly
// these rules (wait for both receives, compute, send both) for P ≤ 5, v ≤ 3, up to 12 micro-batches and every group
// size Megatron allows, each to completion; without the extra forward the last stage's first pair would merge a
// micro-batch's forward with its own backward. mpi/test_combined_1f1b_pipeline.cpp runs it with micro-batch counts
// that are and are not multiples of P.
StepLoss PipelineSchedule::run(nn::GPTModel& model, const std::vector<PipelinePass>& order, Run& r) {
  MOE_ASSERT(static_cast<int64_t>(model.num_chunks()) == v_);
  const int64_t m = static_cast<int64_t>(r.batches.size());
  Live l(TokenScale{r.per_token_loss, r.global_tokens, r.dp, m, r.loss_scale});
  peak_in_flight_ = 0;
  auto needs_recv = [&](const PipelinePass& p) {
    return p.forward ? p2p_.receives_input(p.chunk) : p2p_.sends_output(p.chunk);
  };
  // Receives are posted one pass ahead (a merged pair's both and the pass after it), so a message can arrive while
  // the pass before it computes.
  size_t posted = 0;  // receives posted for order[0, posted)
  auto post_through = [&](size_t k) {
    for (; posted <= k && posted < order.size(); posted++)
      if (needs_recv(order[posted])) p2p_.post_recv(order[posted].chunk, !order[posted].forward);
  };
  const double t0 = now_seconds();
  double waited = 0;
  for (size_t k = 0; k < order.size(); k++) {
    const PipelinePass& p = order[k];
    if (p.merged && r.merge) {
      MOE_ASSERT(k + 1 < order.size() && !order[k + 1].forward);
      const PipelinePass& b = order[k + 1];
      MOE_ASSERT_MSG(p.micro_batch != b.micro_batch, "a merged pair's forward and backward share micro-batch {}",
                     b.micro_batch);
      post_through(k + 2);
      const Tensor in = receive(p, model, waited), dy = receive(b, model, waited);
      combined_forward_backward(
          p.micro_batch, [&] { forward_pass(model, p, in, r, l); }, b.micro_batch,
          [&] { backward_pass(model, b, dy, r, l); });
      k++;
      continue;
    }
    post_through(k + 1);
    if (p.forward)
      forward_pass(model, p, receive(p, model, waited), r, l);
    else
      backward_pass(model, p, receive(p, model, waited), r, l);
  }
  // The embedding, final norm and output layer: final once every pass is done (the tied word embedding's
  // gradient summed over the embedding group first, in ChainedOptimizer).
  if (r.opt) r.opt->layer_grads_final(static_cast<size_t>(model.config().num_layers));
  p2p_.finish_sends();
  passes_seconds_ = now_seconds() - t0;
  waited_seconds_ = waited;
  MOE_ASSERT_MSG(l.stash.empty(), "{} passes left without their backward", l.stash.size());
  // The loss lives on the last stage: summed over the pipeline group, every stage reports it.
  Tensor t = Tensor::empty({2}, DType::F64);
  t.set_item(0, l.loss.sum);
  t.set_item(1, l.loss.tokens);
  pp_.all_reduce(t);
  return {t.item(0), t.item(1)};
}

StepLoss PipelineSchedule::forward_backward(nn::GPTModel& model, nn::GPTModel::Stash&, const data::SampleSource& data,
                                            const data::SampleCursor& cursor, const MicroBatches& mb,
                                            optim::ChainedOptimizer& opt) {
  return forward_backward(model, data, cursor, mb, &opt);
}

StepLoss PipelineSchedule::forward_backward(nn::GPTModel& model, const data::SampleSource& data,
                                            const data::SampleCursor& cursor, const MicroBatches& mb,
                                            optim::ChainedOptimizer* opt) {
  Run r;
  r.backward = true;
  r.merge = combined_ && opt;  // the fault locator's re-run: the same passes, one at a time
  r.opt = opt;
  r.per_token_loss = mb.per_token_loss;
  r.loss_scale = mb.loss_scale;
  r.dp = static_cast<double>(mb.dp_size * mb.cp_size);
  r.cp = static_cast<double>(mb.cp_size);
  // Every stage reads the micro-batches (the first needs the tokens, the last the labels; all need the sample
  // indices for dropout and, with per-token loss, the global batch's loss tokens before the first backward).
  for (int64_t i = 0; i < mb.count; i++) {
    TimerScope timer("batch-generator", 2);
    r.samples.push_back(cursor.micro_batch(i, mb.dp_rank, mb.dp_size, mb.size));
    r.batches.push_back(data::make_batch(data, r.samples.back(), mb.eod_mask_token));
    r.global_tokens += loss_tokens(r.batches.back());
  }
  if (mb.per_token_loss && mb.dp) {
    Tensor t = Tensor::empty({1}, DType::F64);
    t.set_item(0, r.global_tokens);
    mb.dp->all_reduce(t);
    r.global_tokens = t.item(0) / r.cp;  // each CP rank counted its sequences' tokens
  }
  const auto order = pipeline_order(mb.count, pp_.size(), pp_.rank(), v_, group_, false, combined_);
  return run(model, order, r);
}

StepLoss PipelineSchedule::forward_only(nn::GPTModel& model, const data::SampleSource& data,
                                        const std::function<std::vector<int64_t>(int64_t)>& samples, int64_t count,
                                        int64_t eod_mask_token) {
  Run r;
  for (int64_t i = 0; i < count; i++) {
    r.samples.push_back(samples(i));
    r.batches.push_back(data::make_batch(data, r.samples.back(), eod_mask_token));
  }
  // Megatron runs evaluation's forward passes in the schedule table's order (no micro-batch rules: any count).
  const auto table = pipeline_schedule_table(count, v_, v_ > 1 ? std::min(group_, count) : count);
  std::vector<PipelinePass> order;
  for (const auto& [i, c] : table) order.push_back({true, i, c});
  return run(model, order, r);
}

}  // namespace moecore::train
