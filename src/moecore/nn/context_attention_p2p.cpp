// --cp-comm-type p2p: ring attention (TransformerEngine's attn_forward_func_with_cp, written for the CPU). At step s
// of C, rank r holds the K/V of rank r−s (they arrived during step s−1) and sends them on to r+1 while it computes
// its queries against them: with the load-balanced split, each (query chunk, key chunk) pair of chunk ids cq, ck is
// skipped when ck > cq, computed with the causal mask when ck = cq, and unmasked when ck < cq (the block kernel
// decides tile by tile from the global positions). Partial (o, lse) results merge in step order, so reruns are
// bitwise identical. Backward: dK/dV of the block a rank holds travel one step behind the K/V, each holder adding
// its term; after C steps they are one hop from their owner. dQ stays local.
// The ring works on any chunk layout (ids_of): a2a+p2p runs it over the outer group on the a2a'd rows.
#include <algorithm>
#include <limits>
#include <tuple>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/context_attention_parts.h"

namespace moecore::nn::cp_parts {

namespace {

constexpr int kTagKv = 0x4350, kTagDkv = 0x4351;  // "CP"

// K rows then V rows, one message.
Tensor pack_kv(const Tensor& k, const Tensor& v) {
  Tensor kv = Tensor::empty({2 * k.dim(0), k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), k.device());
  kv.slice(0, k.dim(0)).copy_from(k);
  kv.slice(k.dim(0), k.dim(0)).copy_from(v);
  return kv;
}

void add_into(Tensor& acc, const Tensor& x) {
  kernels::add_(acc, x);
}

// lse [B, N, R] <- the per-chunk pieces [B, N, sc] in chunk order.
void join_lse(const std::vector<Tensor>& parts, int64_t sc, Tensor& lse) {
  for (size_t c = 0; c < parts.size(); c++) set_lse_columns(lse, static_cast<int64_t>(c), sc, parts[c]);
}

struct Ring {
  const comm::ProcessGroup* g;
  int64_t size, me, next, prev;
  explicit Ring(const comm::ProcessGroup* ring)
      : g(ring),
        size(ring ? ring->size() : 1),
        me(ring ? ring->rank() : 0),
        next((me + 1) % size),
        prev((me + size - 1) % size) {}
  int64_t src(int64_t step) const { return (me - step + size) % size; }
};

// Starts one ring step's K/V transfer: `cur` to the next rank, the previous rank's block into `nxt`.
void pass_kv(const Ring& rg, const Tensor& cur, Tensor& nxt, comm::Work& sent, comm::Work& got) {
  // One exchange: over NCCL a grouped send and receive (each rank sends to one neighbour while receiving from the
  // other, which separate NCCL calls could not do without deadlocking the ring).
  std::tie(sent, got) = rg.g->send_recv(cur, rg.next, nxt, rg.prev, kTagKv, /*async=*/true);
}

}  // namespace

void ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const comm::ProcessGroup* ring,
                  const std::vector<ChunkIds>& ids_of, int64_t sc, Tensor& o, Tensor& lse,
                  const kernels::AttentionDropout* dropout, bool bf16) {
  const Ring rg(ring);
  const ChunkIds& mine = ids_of[static_cast<size_t>(rg.me)];
  const int64_t nq = static_cast<int64_t>(mine.size()), R = k.dim(0);
  MOE_ASSERT(q.dim(0) == nq * sc);
  std::vector<Tensor> lse_parts;
  for (int64_t c = 0; c < nq; c++) lse_parts.push_back(empty_lse(q.dim(1), q.dim(2), sc, q));
  o.zero_();
  Tensor cur = pack_kv(k, v), nxt = Tensor::empty(cur.shape(), cur.dtype(), cur.device());
  Tensor part_o = Tensor::empty({sc, q.dim(1), q.dim(2), q.dim(3)}, q.dtype(), q.device());
  Tensor part_l = Tensor::empty({q.dim(1), q.dim(2), sc}, q.dtype(), q.device());
  for (int64_t s = 0; s < rg.size; s++) {
    comm::Work sent, got;
    if (s + 1 < rg.size) pass_kv(rg, cur, nxt, sent, got);
    const ChunkIds& theirs = ids_of[static_cast<size_t>(rg.src(s))];
    const Tensor kb = cur.slice(0, R), vb = cur.slice(R, R);
    for (int64_t i = 0; i < nq; i++)
      for (size_t j = 0; j < theirs.size(); j++) {
        const int64_t cq = mine[static_cast<size_t>(i)], ck = theirs[j];
        if (ck > cq) continue;  // wholly masked
        kernels::attention_block_forward(chunk_rows(q, i, sc), chunk_rows(kb, static_cast<int64_t>(j), sc),
                                         chunk_rows(vb, static_cast<int64_t>(j), sc), cq * sc, ck * sc, scale, part_o,
                                         part_l, dropout, bf16);
        Tensor oc = chunk_rows(o, i, sc);
        kernels::attention_merge(oc, lse_parts[static_cast<size_t>(i)], part_o, part_l);
        if (got.pending()) got.test();  // lets MPI progress the transfer between blocks
      }
    sent.wait();
    got.wait();
    std::swap(cur, nxt);
  }
  join_lse(lse_parts, sc, lse);
}

void ring_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, double scale, const comm::ProcessGroup* ring, const std::vector<ChunkIds>& ids_of,
                   int64_t sc, Tensor& dq, Tensor& dk, Tensor& dv, const kernels::AttentionDropout* dropout,
                   bool bf16) {
  const Ring rg(ring);
  const ChunkIds& mine = ids_of[static_cast<size_t>(rg.me)];
  const int64_t nq = static_cast<int64_t>(mine.size()), R = k.dim(0);
  std::vector<Tensor> lse_parts;
  for (int64_t c = 0; c < nq; c++) lse_parts.push_back(lse_columns(lse, c, sc));
  dq.zero_();
  const Device dev = k.device();
  Tensor cur = pack_kv(k, v), nxt = Tensor::empty(cur.shape(), cur.dtype(), dev);
  Tensor dkv_part = Tensor::empty(cur.shape(), cur.dtype(), dev);
  Tensor dkv_in = Tensor::empty(cur.shape(), cur.dtype(), dev), dkv_out = Tensor::empty(cur.shape(), cur.dtype(), dev);
  Tensor dk_b = Tensor::empty({sc, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), dev);
  Tensor dv_b = Tensor::empty(dk_b.shape(), dk_b.dtype(), dev);
  comm::Work dkv_sent, dkv_got;
  for (int64_t s = 0; s < rg.size; s++) {
    comm::Work sent, got;
    if (s + 1 < rg.size) pass_kv(rg, cur, nxt, sent, got);
    const ChunkIds& theirs = ids_of[static_cast<size_t>(rg.src(s))];
    const Tensor kb = cur.slice(0, R), vb = cur.slice(R, R);
    dkv_part.zero_();
    for (int64_t i = 0; i < nq; i++)
      for (size_t j = 0; j < theirs.size(); j++) {
        const int64_t cq = mine[static_cast<size_t>(i)], ck = theirs[j], jj = static_cast<int64_t>(j);
        if (ck > cq) continue;
        Tensor dqc = chunk_rows(dq, i, sc);
        kernels::attention_block_backward(chunk_rows(dout, i, sc), chunk_rows(q, i, sc), chunk_rows(kb, jj, sc),
                                          chunk_rows(vb, jj, sc), chunk_rows(o, i, sc),
                                          lse_parts[static_cast<size_t>(i)], cq * sc, ck * sc, scale, dqc, dk_b, dv_b,
                                          dropout, bf16);
        Tensor dkc = chunk_rows(dkv_part, jj, sc), dvc = dkv_part.slice(R + jj * sc, sc);
        add_into(dkc, dk_b);
        add_into(dvc, dv_b);
        if (got.pending()) got.test();
      }
    // The dK/dV of the block held this step: what earlier holders accumulated, plus this rank's term.
    if (s > 0) {
      dkv_got.wait();
      add_into(dkv_in, dkv_part);
    } else {
      dkv_in.copy_from(dkv_part);
    }
    dkv_sent.wait();
    std::swap(dkv_in, dkv_out);  // dkv_out: to send; dkv_in: free for the next receive
    if (rg.size > 1) {
      std::tie(dkv_sent, dkv_got) = rg.g->send_recv(dkv_out, rg.next, dkv_in, rg.prev, kTagDkv, /*async=*/true);
    }
    sent.wait();
    got.wait();
    std::swap(cur, nxt);
  }
  // After the last step the block held is the next rank's; this rank's own arrives from the previous one.
  dkv_sent.wait();
  dkv_got.wait();
  const Tensor& own = rg.size > 1 ? dkv_in : dkv_out;
  dk.copy_from(own.slice(0, R));
  dv.copy_from(own.slice(R, R));
}

void p2p_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const ContextParallel& cp, Tensor& o,
                 Tensor& lse, const kernels::AttentionDropout* dropout) {
  std::vector<ChunkIds> ids;
  for (int64_t r = 0; r < cp.size; r++) ids.push_back(balanced_chunks(r, cp.size));
  ring_forward(q, k, v, scale, cp.group, ids, q.dim(0) / 2, o, lse, dropout, cp.bf16);
}

void p2p_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk, Tensor& dv,
                  const kernels::AttentionDropout* dropout) {
  std::vector<ChunkIds> ids;
  for (int64_t r = 0; r < cp.size; r++) ids.push_back(balanced_chunks(r, cp.size));
  ring_backward(dout, q, k, v, o, lse, scale, cp.group, ids, q.dim(0) / 2, dq, dk, dv, dropout, cp.bf16);
}

}  // namespace moecore::nn::cp_parts
