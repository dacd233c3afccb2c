// The sub-steps of a transformer layer as Megatron's combined 1F1B schedule runs them (--overlap-moe-expert-parallel-
// comm; model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run), and the trace of what ran while which
// all-to-all was in flight. The MoE layer marks its boundaries here; the combined schedule
// (train/pipeline/combined_1f1b.h) switches micro-batches at them. Outside that schedule a boundary does nothing.
//
// Megatron's order for forward layer i of micro-batch m+1 (f) beside backward layer L−1−i of micro-batch m (b):
//   b: combine backward (all-to-all of the output gradient)  | f: attention + post-attention + router + permute
//   b: experts backward                                      | f: dispatch (all-to-all)
//   b: dispatch backward (all-to-all)                        | f: experts
//   f: combine (all-to-all)                                  | b: router + attention backward
// Each all-to-all is posted by one micro-batch and waited at that micro-batch's next sub-step, after the other
// micro-batch's sub-step ran: here the two alternate at every boundary, backward first, so
//   b: [... mlp-dropout backward, unpermute-backward, post combine-backward]      ← boundary
//   f: [... attention, router, permute, post dispatch]                          ← boundary
//   b: [wait combine-backward, experts backward, post dispatch-backward]         ← boundary
//   f: [wait dispatch, experts, post combine]                                    ← boundary
//   b: [wait dispatch-backward, router + attention backward, next layer ...]     ← boundary
//   f: [wait combine, residual, next layer's attention ...]                      ← boundary
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::nn {

enum class A2A { Dispatch, Combine, CombineBackward, DispatchBackward };
const char* a2a_name(A2A a);

// One sub-step as the combined schedule ran it: which micro-batch and direction, the MoE layer and the sub-step
// that began, and the all-to-alls then in flight (posted by either micro-batch, not yet waited).
struct SubStepRecord {
  int64_t micro_batch = 0;
  bool forward = true;
  std::string layer, step;
  struct InFlight {
    int64_t micro_batch;
    bool forward;
    std::string layer;
    A2A kind;
  };
  std::vector<InFlight> in_flight;
};

// The switch between micro-batches (set by the combined schedule while it merges two of them; null otherwise).
class SubStepSwitch {
 public:
  virtual ~SubStepSwitch() = default;
  virtual void boundary() = 0;
  // The running side's micro-batch and direction (for the trace).
  virtual int64_t micro_batch() const = 0;
  virtual bool forward() const = 0;
};

class SubSteps {
 public:
  // The MoE layer `layer`, in its forward or backward, is about to begin sub-step `next` (see the order above):
  // under the combined schedule the other micro-batch runs its next sub-step first, and the trace records this one.
  static void boundary(const std::string& layer, const char* next);
  // An all-to-all of `layer` was posted non-blocking / was waited for.
  static void posted(const std::string& layer, A2A kind);
  static void waited(const std::string& layer, A2A kind);
  static void set_switch(SubStepSwitch* s);
  static SubStepSwitch* active();
  // The trace since the last take_trace (recorded only while a switch is set and tracing is on).
  static void set_tracing(bool on);
  static std::vector<SubStepRecord> take_trace();
};

}  // namespace moecore::nn
