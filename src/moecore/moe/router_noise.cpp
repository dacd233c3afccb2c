// The router's noise (see router.h): the jitter multipliers and the forced-balance logits, drawn on the host by global
// token index from the router's Philox streams, so every device, layout and replay sees the same bits.
#include "moecore/core/rng.h"
#include "moecore/moe/router.h"

namespace moecore::moe {

Router::NoisePosition Router::noise_position(int64_t T, bool training, const Stash& st) {
  // A replay draws the recorded forward's noise and advances nothing.
  NoisePosition n;
  n.forward = st.recompute ? st.replay.forward_index : forward_count_;
  if (training && !st.recompute) forward_count_++;
  // Under sequence parallelism this rank's tokens start at rank·T.
  n.first_token = static_cast<uint64_t>(cfg_.count_group ? cfg_.count_group->rank() * T : 0);
  return n;
}

Tensor Router::jitter_multipliers(int64_t T, const NoisePosition& n) const {
  const int64_t H = cfg_.hidden;
  Tensor u = Tensor::empty({T, H}, cfg_.router_dtype);
  const Philox rng(cfg_.seed, jitter_stream_ + n.forward);
  const double eps = cfg_.input_jitter_eps;
  MOE_DISPATCH_FLOAT(cfg_.router_dtype, R, {
    R* p = u.data<R>();
    for (int64_t i = 0; i < T * H; i++)
      p[i] = static_cast<R>(1.0 - eps + 2.0 * eps * rng.uniform(n.first_token * static_cast<uint64_t>(H) + i));
  });
  return u;
}

Tensor Router::balance_noise(int64_t T, const NoisePosition& n) const {
  const int64_t E = cfg_.num_experts;
  Tensor z = Tensor::empty({T, E}, cfg_.router_dtype);
  const Philox rng(cfg_.seed, balance_stream_ + n.forward);
  for (int64_t i = 0; i < T * E; i++) z.set_item(i, rng.normal(n.first_token * static_cast<uint64_t>(E) + i));
  return z;
}

}  // namespace moecore::moe
