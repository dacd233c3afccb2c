// The expert-parallel dispatcher's buffers in the memory plan (memory_plan.h), by name: what one MoE layer's
// dispatch and combine allocate while they run, sized as the dispatchers size them, from the routed rows each rank
// exchanges (the counts go first, moe/token_dispatcher.cpp), for the balanced routing the rest of the plan assumes
// (T·K rows per rank, every expert its capacity under padding). On a GPU the same sizes travel through host copies
// (comm/process_group.cpp). Transient: freed when the layer's dispatch or combine returns, inside the backward working
// set and the stashes the plan counts already, so named here and not added again.
#include <algorithm>

#include "moecore/moe/moe_layer.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/train/memory_plan.h"

namespace moecore::train {

std::vector<MemoryPlan::Buffer> dispatch_buffers(const TrainConfig& c, const PlanLayout& l) {
  std::vector<MemoryPlan::Buffer> b;
  const int64_t P = l.ep, etp = l.etp;
  if (c.num_experts <= 0 || (P <= 1 && etp <= 1)) return b;
  const int64_t T = c.seq_length / std::max<int64_t>(l.cp, 1) / std::max<int64_t>(l.tp, 1) * c.micro_batch_size;
  const int64_t H = c.hidden_size, K = c.moe_router_topk, E = c.num_experts;
  const DType rows_t = low_precision(c).value_or(DType::F32);
  const auto add = [&](const char* name, int64_t numel, DType dt) {
    b.push_back({name, static_cast<double>(nn::tensor_bytes(numel, dt))});
  };
  int64_t rows = T * K;  // what this rank routes; balanced, what it receives too
  if (c.moe_expert_capacity_factor >= 0 && c.moe_pad_expert_input_to_capacity) {
    const moe::RouterConfig rc = router_config(c);
    rows = E * std::min(moe::expert_capacity(rc, T), T);
  }
  if (P > 1 && c.moe_token_dispatcher_type == "allgather") {
    add("dispatch all-gather: tokens [EP·T, H]", P * T * H, rows_t);
    add("dispatch all-gather: expert ids [EP·T, K]", P * T * K, DType::I32);
    add("dispatch all-gather: probabilities [EP·T, K]", P * T * K, DType::F32);
    add("combine reduce-scatter: partial outputs [EP·T, H]", P * T * H, DType::F32);
  } else if (P > 1) {
    add("dispatch all-to-all: expert counts [EP, E]", P * E, DType::I64);
    add("dispatch all-to-all: rows sent [T·K, H]", rows * H, rows_t);
    add("dispatch all-to-all: probabilities sent [T·K]", rows, DType::F32);
    add("dispatch all-to-all: rows received [R, H]", rows * H, rows_t);
    add("dispatch all-to-all: probabilities received [R]", rows, DType::F32);
    add("combine all-to-all: rows sent back [R, H]", rows * H, DType::F32);
    add("combine all-to-all: rows received back [T·K, H]", rows * H, DType::F32);
  }
  if (etp > 1) {
    add("ETP all-gather: row counts [ETP, E/EP]", etp * (E / P), DType::I64);
    add("ETP all-gather: rows [ETP·R, H]", etp * rows * H, rows_t);
    add("ETP all-gather: rows expert-major [ETP·R, H]", etp * rows * H, rows_t);
    add("ETP reduce-scatter: partial outputs [ETP·R, H]", etp * rows * H, DType::F32);
  }
  return b;
}

}  // namespace moecore::train
