// `moecore bench comm`'s dispatcher table (see comm_dispatch.h): AlltoAll against flex on the same routing.
#include "moecore/cli/bench/comm_dispatch.h"

#include <fmt/format.h>

#include <numeric>
#include <set>

#include "moecore/comm/process_group.h"
#include "moecore/core/error.h"
#include "moecore/moe/flex_dispatcher.h"

namespace moecore::cli {

namespace {

moe::RoutedTokens uniform_routing(int64_t T, int64_t K, int64_t E, uint64_t seed) {
  moe::RoutedTokens r;
  r.idx_TK = Tensor::empty({T, K}, DType::I32);
  r.probs_TK = Tensor::empty({T, K}, DType::F32);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; i--) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(perm[static_cast<size_t>(i)], perm[(x >> 33) % static_cast<uint64_t>(i + 1)]);
    }
    for (int64_t j = 0; j < K; j++) {
      r.idx_TK.data<int32_t>()[t * K + j] = perm[static_cast<size_t>(j)];
      r.probs_TK.data<float>()[t * K + j] = 1.0f / static_cast<float>(K);
    }
  }
  return r;
}

double a2a_payload() {
  const auto& m = comm::comm_counters();
  const auto it = m.find("dispatch:all_to_all_v");
  return it == m.end() ? 0.0 : it->second.payload_bytes;
}

}  // namespace

void bench_dispatch_bytes(const train::TrainConfig& cfg, bool bf16_rows) {
  comm::ProcessGroup::init(nullptr, nullptr);
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  std::iota(all.begin(), all.end(), 0);
  comm::ProcessGroup ep = world.split({all});
  ep.set_name("dispatch");
  const int64_t P = ep.size(), E = cfg.num_experts, K = cfg.moe_router_topk, H = cfg.hidden_size;
  const int64_t T = cfg.seq_length * cfg.micro_batch_size, n_local = E / P;
  const DType rows_t = bf16_rows ? DType::BF16 : DType::F32, sum_t = kernels::moe_row_sum_dtype(rows_t);
  const double rb = static_cast<double>(dtype_size(rows_t)), sb = static_cast<double>(dtype_size(sum_t));
  const moe::RoutedTokens r = uniform_routing(T, K, E, 1000 + static_cast<uint64_t>(ep.rank()));
  // The analytic counts, from the routing alone.
  double assignments = 0, distinct = 0;
  for (int64_t t = 0; t < T; t++) {
    std::set<int64_t> ranks;
    for (int64_t j = 0; j < K; j++) ranks.insert(r.idx_TK.data<int32_t>()[t * K + j] / n_local);
    assignments += static_cast<double>(K);
    distinct += static_cast<double>(ranks.size());
  }
  Tensor x = Tensor::zeros({T, H}, DType::F32);
  // Per dispatcher: token bytes dispatched and combined (the send buffers), the counters' all-to-all payload.
  Tensor v = Tensor::zeros({11}, DType::F64);
  auto run = [&](moe::TokenDispatcher& d, int slot, bool flex) {
    moe::DispatchPlan plan;
    plan.rows_dtype = rows_t;
    Tensor x_RH, p_R;
    const double before = a2a_payload();
    d.dispatch(x, r, plan, x_RH, p_R);
    const double sent = static_cast<double>(flex ? plan.send_token.numel() : plan.local_rows);
    v.set_item(slot, v.item(slot) + sent * static_cast<double>(H) * rb);
    // The metadata beside the tokens: flex, an assignment's token row and local expert (2 x I32) and probability;
    // AlltoAll, the probability.
    const double meta = static_cast<double>(plan.local_rows) * (sb + (flex ? 8.0 : 0.0));
    v.set_item(slot + 2, a2a_payload() - before - meta);
    const double mid = a2a_payload();
    const Tensor y = d.combine(x_RH, plan);
    v.set_item(slot + 1, sent * static_cast<double>(H) * (flex ? sb : rb));
    v.set_item(slot + 3, a2a_payload() - mid);
  };
  moe::AllToAllTokenDispatcher a2a(ep, E);
  moe::FlexTokenDispatcher flex(ep, E);
  run(a2a, 0, false);
  run(flex, 4, true);
  v.set_item(8, distinct * static_cast<double>(H) * rb);
  v.set_item(9, assignments * static_cast<double>(H) * rb);
  v.set_item(10, distinct * static_cast<double>(H) * sb);  // flex's partial sums return in the row-sum dtype
  world.all_reduce(v);
  const double flex_bytes = v.item(4), analytic = v.item(8);
  if (world.rank() == 0) {
    fmt::print(
        "  dispatchers on one routing ({} ranks, {} tokens per rank, top-{} of {} experts, H={}, {} rows), token "
        "bytes summed over ranks (measured: the all-to-all payload the counters saw, less the routing metadata)\n",
        P, T, K, E, H, bf16_rows ? "bf16" : "f32");
    fmt::print(
        "comm_dispatch dispatcher=alltoall dispatch_bytes={:.0f} measured={:.0f} combine_bytes={:.0f} "
        "measured={:.0f} analytic_assignments={:.0f}\n",
        v.item(0), v.item(2), v.item(1), v.item(3), v.item(9));
    fmt::print(
        "comm_dispatch dispatcher=flex dispatch_bytes={:.0f} measured={:.0f} combine_bytes={:.0f} "
        "measured={:.0f} analytic_distinct={:.0f} analytic_combine={:.0f} equal={}\n",
        v.item(4), v.item(6), v.item(5), v.item(7), analytic, v.item(10),
        flex_bytes == analytic && v.item(6) == analytic && v.item(7) == v.item(10) ? "yes" : "no");
  }
  MOE_CHECK(flex_bytes == analytic && v.item(6) == analytic && v.item(7) == v.item(10),
            "bench comm: flex dispatched {} token bytes ({} measured) and combined {} measured; the analytic counts "
            "are {} and {}",
            flex_bytes, v.item(6), v.item(7), analytic, v.item(10));
}

}  // namespace moecore::cli
