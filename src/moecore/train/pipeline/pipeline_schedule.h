// Pipeline-parallel schedules behind the Schedule seam (schedule.h): Megatron's 1F1B (warm-up forwards, steady
// one-forward-one-backward, cool-down backwards) and interleaved 1F1B over v model chunks per rank, in Megatron's
// exact order of micro-batches and chunks (schedules.py: get_pp_rank_microbatches, get_schedule_table). Each pass
// runs one chunk of GPTModel; hidden states and their gradients travel through PipelineP2P. Not the stage layout
// (pipeline_stages.h) and not the transport.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "moecore/train/pipeline/pipeline_p2p.h"
#include "moecore/train/pipeline/schedule.h"

namespace moecore::train {

// One pass of a rank's schedule: forward or backward of `chunk` on `micro_batch`.
struct PipelinePass {
  bool forward = true;
  int64_t micro_batch = 0, chunk = 0;
  // Combined 1F1B: this forward runs merged with the backward that follows it in the order (combined_1f1b.h).
  bool merged = false;
  bool operator==(const PipelinePass&) const = default;
};

// Megatron's order of the passes of pipeline rank `rank` of P, with v chunks per rank, m micro-batches and
// micro-batch groups of `group` (--microbatch-group-size-per-virtual-pipeline-stage; P by default). v = 1: 1F1B
// (warm-up min(P − rank − 1, m)). Checks Megatron's micro-batch rules for interleaving (messages as Megatron's).
// combined: Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm; P = 1 or v ≥ 2): one forward more in the
// warm-up (get_pp_rank_microbatches; without pipelining the first forward alone), and each steady-state forward
// marked `merged` with the backward after it; the passes themselves, and so each chunk's micro-batch order forward
// and backward, are the plain schedule's.
std::vector<PipelinePass> pipeline_order(int64_t m, int64_t P, int64_t rank, int64_t v, int64_t group,
                                         bool forward_only = false, bool combined = false);
// Megatron's schedule table: the (micro-batch, chunk) of each forward, in order.
std::vector<std::pair<int64_t, int64_t>> pipeline_schedule_table(int64_t m, int64_t v, int64_t group);

class PipelineSchedule : public Schedule {
 public:
  // `hidden`: the stage-boundary shape [S/TP, B, H]; `group` 0: P. combined: Megatron's combined 1F1B inside the
  // interleaved schedule (pipeline_order; each merged pair run by combined_forward_backward).
  PipelineSchedule(const comm::ProcessGroup& pp, int64_t virtual_stages, int64_t group, const Shape& hidden,
                   bool combined = false);
  void set_device(Device d) { p2p_.set_device(d); }  // the stages' device (PipelineP2P::set_device)
  StepLoss forward_backward(nn::GPTModel& model, nn::GPTModel::Stash& stash, const data::SampleSource& data,
                            const data::SampleCursor& cursor, const MicroBatches& mb,
                            optim::ChainedOptimizer& opt) override;
  // The same passes with the optimizer's gradient hooks when `opt` is given (null: none, for a re-run of the step
  // that only looks at the values, as train/health's fault locator does; that re-run runs a merged pair's two
  // passes one after the other, the same values, so that its probe sees one pass at a time).
  StepLoss forward_backward(nn::GPTModel& model, const data::SampleSource& data, const data::SampleCursor& cursor,
                            const MicroBatches& mb, optim::ChainedOptimizer* opt);
  // Forward only (evaluation) over `count` micro-batches with the given samples; the loss summed over the pipeline
  // group (every stage returns it).
  StepLoss forward_only(nn::GPTModel& model, const data::SampleSource& data,
                        const std::function<std::vector<int64_t>(int64_t)>& samples, int64_t count,
                        int64_t eod_mask_token);

  // For `moecore bench pipeline`: the most (micro-batch, chunk) activations this rank held at once in the last
  // step, the bytes it sent since construction, and of the last step's passes the seconds spent waiting for a
  // neighbour's message (the bubble) and in all.
  int64_t peak_in_flight() const { return peak_in_flight_; }
  int64_t sent_bytes() const { return p2p_.sent_bytes(); }
  double waited_seconds() const { return waited_seconds_; }
  double passes_seconds() const { return passes_seconds_; }
  // The pass running now (or last run): what a module probe sees belongs to it.
  const PipelinePass& current_pass() const { return current_; }

 private:
  struct Run;
  struct Live;
  StepLoss run(nn::GPTModel& model, const std::vector<PipelinePass>& order, Run& r);
  // A forward pass from its received input (the tokens on the embedding chunk) through its send, and a backward
  // from its received output gradient through its send.
  void forward_pass(nn::GPTModel& model, const PipelinePass& p, const Tensor& in, Run& r, Live& l);
  void backward_pass(nn::GPTModel& model, const PipelinePass& p, const Tensor& dy, Run& r, Live& l);
  // The received input of forward p / output gradient of backward p (empty where none comes from another stage).
  Tensor receive(const PipelinePass& p, nn::GPTModel& model, double& waited);
  const comm::ProcessGroup& pp_;
  int64_t v_, group_;
  bool combined_ = false;
  PipelineP2P p2p_;
  std::vector<nn::GPTModel::Stash> stashes_;  // one per micro-batch in flight, reused across steps
  std::vector<size_t> free_;
  PipelinePass current_;
  int64_t peak_in_flight_ = 0;
  double waited_seconds_ = 0, passes_seconds_ = 0;
};

}  // namespace moecore::train
