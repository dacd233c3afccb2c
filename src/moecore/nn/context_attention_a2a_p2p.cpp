// --cp-comm-type a2a+p2p with --hierarchical-context-parallel-sizes [a, p] (TransformerEngine's hierarchical CP):
// an all-to-all inside the inner group of a ranks turns their 2a chunks of every head into all 2a chunks of Nq/a
// heads; the K/V ring of context_attention_p2p.cpp then runs over the outer group of p ranks (which hold the same
// head shard) on those chunk sets; the result returns through the inverse all-to-all. Chunk ids come from the
// groups themselves (each member's CP rank), so any rank order of the groups works. GPU tensors: the all-to-all's
// layout work on host copies, as context_attention_a2a.cpp; the ring and its kernels on the GPU.
#include "moecore/comm/process_group.h"
#include "moecore/kernels/attention.h"
#include "moecore/nn/context_attention_parts.h"

namespace moecore::nn::cp_parts {

namespace {

struct Layout {
  const comm::ProcessGroup *inner, *outer;
  int64_t a, n;                  // inner size, query heads per rank after the all-to-all
  std::vector<ChunkIds> ids_of;  // chunks of each outer member after the all-to-all
};

Layout layout(const ContextParallel& cp, int64_t Nq) {
  MOE_ASSERT_MSG(cp.inner && cp.outer && cp.inner->size() * cp.outer->size() == cp.size,
                 "a2a+p2p needs inner and outer groups whose sizes multiply to the CP size {}", cp.size);
  Layout l{cp.inner, cp.outer, cp.inner->size(), 0, {}};
  check_heads(Nq, l.a, "a2a+p2p");
  l.n = Nq / l.a;
  ChunkIds mine;
  for (int64_t r : gather_ints(cp.rank, *cp.inner))
    for (int64_t c : balanced_chunks(r, cp.size)) mine.push_back(c);
  const std::vector<int64_t> shard = gather_ints(cp.inner->rank(), *cp.outer);
  for (int64_t s : shard)
    MOE_ASSERT_MSG(s == cp.inner->rank(), "a2a+p2p: outer group members hold different head shards");
  const int64_t k = static_cast<int64_t>(mine.size()), p = cp.outer->size();
  Tensor in = Tensor::empty({k}, DType::I64), all = Tensor::empty({p * k}, DType::I64);
  std::copy(mine.begin(), mine.end(), in.data<int64_t>());
  cp.outer->all_gather(in, all);
  for (int64_t m = 0; m < p; m++) l.ids_of.emplace_back(all.data<int64_t>() + m * k, all.data<int64_t>() + (m + 1) * k);
  return l;
}

// For tensors on any device (the layout work and the all-to-all on a host copy, the head shard back on x's device):
// x's head shard, and K/V's with their heads expanded for Nq query heads first.
Tensor heads_of(const Tensor& x, const comm::ProcessGroup& g) {
  return to_device_of(seq_to_heads(on_host(x), g), x);
}
Tensor kv_heads_of(const Tensor& kv, int64_t Nq, const comm::ProcessGroup& g) {
  return to_device_of(seq_to_heads(expand_kv_heads(on_host(kv), Nq, g.size()), g), kv);
}

}  // namespace

void a2a_p2p_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const ContextParallel& cp,
                     Tensor& o, Tensor& lse, const kernels::AttentionDropout* dropout) {
  const int64_t Nq = q.dim(2), sc = q.dim(0) / 2;
  const Layout l = layout(cp, Nq);
  const comm::ProcessGroup& g = *l.inner;
  const Tensor qh = heads_of(q, g), kh = kv_heads_of(k, Nq, g), vh = kv_heads_of(v, Nq, g);
  kernels::AttentionDropout drop;
  if (dropout) drop = head_shard(dropout, g.rank() * l.n);
  Tensor oh = Tensor::empty(qh.shape(), q.dtype(), q.device());
  Tensor lh = Tensor::empty({q.dim(1), l.n, qh.dim(0)}, q.dtype(), q.device());
  ring_forward(qh, kh, vh, scale, l.outer, l.ids_of, sc, oh, lh, dropout ? &drop : nullptr, cp.bf16);
  o.copy_from(heads_to_seq(on_host(oh), g));
  lse.copy_from(lse_from_rows(heads_to_seq(lse_rows(on_host(lh)), g)));
}

void a2a_p2p_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk, Tensor& dv,
                      const kernels::AttentionDropout* dropout) {
  const int64_t Nq = q.dim(2), Nkv = k.dim(2), sc = q.dim(0) / 2;
  const Layout l = layout(cp, Nq);
  const comm::ProcessGroup& g = *l.inner;
  const Tensor qh = heads_of(q, g), doh = heads_of(dout, g), oh = heads_of(o, g);
  const Tensor kh = kv_heads_of(k, Nq, g), vh = kv_heads_of(v, Nq, g);
  const Tensor lh = to_device_of(lse_from_rows(seq_to_heads(lse_rows(on_host(lse)), g)), q);
  kernels::AttentionDropout drop;
  if (dropout) drop = head_shard(dropout, g.rank() * l.n);
  const Device dev = q.device();
  Tensor dqh = Tensor::empty(qh.shape(), q.dtype(), dev), dkh = Tensor::empty(kh.shape(), q.dtype(), dev);
  Tensor dvh = Tensor::empty(vh.shape(), q.dtype(), dev);
  ring_backward(doh, qh, kh, vh, oh, lh, scale, l.outer, l.ids_of, sc, dqh, dkh, dvh, dropout ? &drop : nullptr,
                cp.bf16);
  dq.copy_from(heads_to_seq(on_host(dqh), g));
  dk.copy_from(reduce_kv_heads(heads_to_seq(on_host(dkh), g), Nkv));
  dv.copy_from(reduce_kv_heads(heads_to_seq(on_host(dvh), g), Nkv));
}

}  // namespace moecore::nn::cp_parts
