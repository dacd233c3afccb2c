// Pieces shared by the --cp-comm-type implementations (context_attention_<type>.cpp), internal to nn/: the chunk
// bookkeeping, the K/V ring over any chunk layout (p2p; a2a+p2p's outer level), the sequence ↔ head all-to-all
// (a2a; a2a+p2p's inner level).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/mla_blocks.h"
#include "moecore/nn/context_attention.h"

namespace moecore::nn::cp_parts {

// The chunks of this rank's rows, in row order: chunk c holds global positions c·sc .. c·sc+sc−1.
using ChunkIds = std::vector<int64_t>;
// CP rank r's chunks under the load-balanced split of 2C chunks: {r, 2C−1−r}.
inline ChunkIds balanced_chunks(int64_t r, int64_t C) {
  return {r, 2 * C - 1 - r};
}

// Attention of q (rows: chunks ids_of[me]) against the K/V of every member of `ring` (member m's rows: chunks
// ids_of[m]), K/V travelling around the ring with non-blocking sends overlapped with the current block's compute.
// o like q, lse [B, Nq, rows]. ring null: this rank alone.
void ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const comm::ProcessGroup* ring,
                  const std::vector<ChunkIds>& ids_of, int64_t sc, Tensor& o, Tensor& lse,
                  const kernels::AttentionDropout* dropout, bool bf16);
// Backward of ring_forward: dq, dk, dv written; dK/dV travel around the ring behind the K/V.
void ring_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, double scale, const comm::ProcessGroup* ring, const std::vector<ChunkIds>& ids_of,
                   int64_t sc, Tensor& dq, Tensor& dk, Tensor& dv, const kernels::AttentionDropout* dropout, bool bf16);

// x [R, B, N, D] (this rank's rows, every head) -> [G·R, B, N/G, D]: block m is member m's rows of this rank's
// head shard (heads m'·N/G .. for this rank m'). N divisible by G = g.size().
Tensor seq_to_heads(const Tensor& x, const comm::ProcessGroup& g);
// The inverse: [G·R, B, N/G, D] -> [R, B, N, D].
Tensor heads_to_seq(const Tensor& x, const comm::ProcessGroup& g);
// lse [B, N, R] <-> [R, B, N, 1] (to go through the all-to-all above).
Tensor lse_rows(const Tensor& lse);
Tensor lse_from_rows(const Tensor& rows);
// K/V heads for a head all-to-all over G ranks: unchanged when G divides Nkv, otherwise each kv head repeated for
// its Nq/Nkv query heads (as TransformerEngine does when kv heads are fewer than the a2a ranks); `reduce_kv_heads`
// sums the gradient of the copies back.
Tensor expand_kv_heads(const Tensor& kv, int64_t Nq, int64_t G);
Tensor reduce_kv_heads(const Tensor& dkv, int64_t Nkv);
// A query-head count that cannot be split: the error names the sizes.
void check_heads(int64_t Nq, int64_t G, const char* what);

// The dropout of a head shard starting at global query head h0 of this call's heads.
inline kernels::AttentionDropout head_shard(const kernels::AttentionDropout* d, int64_t h0) {
  kernels::AttentionDropout out = *d;
  out.head_offset += h0;
  return out;
}

// Member-ordered values of one int64 per member of g.
std::vector<int64_t> gather_ints(int64_t mine, const comm::ProcessGroup& g);
// Rows [c·sc, c·sc + sc) of x (a view).
inline Tensor chunk_rows(const Tensor& x, int64_t c, int64_t sc) {
  return x.slice(c * sc, sc);
}

// lse [B, N, R]'s positions [c·sc, c·sc + sc) as a new [B, N, sc] tensor, and their overwrite from such a piece; on
// lse's device (a column-block move, kernels/mla_blocks.h).
inline Tensor lse_columns(const Tensor& lse, int64_t c, int64_t sc) {
  Tensor out = Tensor::empty({lse.dim(0), lse.dim(1), sc}, lse.dtype(), lse.device());
  kernels::mla_move_block(lse, 1, lse.dim(2), c * sc, out, 1, sc, 0, sc, lse.dim(0) * lse.dim(1));
  return out;
}
inline void set_lse_columns(Tensor& lse, int64_t c, int64_t sc, const Tensor& piece) {
  kernels::mla_move_block(piece, 1, sc, 0, lse, 1, lse.dim(2), c * sc, sc, lse.dim(0) * lse.dim(1));
}
// An lse piece of rows that have seen no key yet: −inf (the merge takes the first part in whole).
inline Tensor empty_lse(int64_t B, int64_t N, int64_t sc, const Tensor& like) {
  Tensor l = Tensor::empty({B, N, sc}, like.dtype(), like.device());
  kernels::fill_(l, -std::numeric_limits<double>::infinity());
  return l;
}

// The layout work around the sequence ↔ head all-to-all runs in host memory, where the host-staged transport
// (comm/process_group.h) holds the rows anyway: a GPU tensor's host copy, and a host result moved to `like`'s device.
inline Tensor on_host(const Tensor& x) {
  return x.to(Device::cpu());
}
inline Tensor to_device_of(const Tensor& x, const Tensor& like) {
  return x.device() == like.device() ? x : x.to(like.device());
}

// The four --cp-comm-type implementations, with context_attention_forward/backward's contracts.
#define MOE_CP_ENTRY(name)                                                                                             \
  void name##_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const ContextParallel& cp,      \
                      Tensor& o, Tensor& lse, const kernels::AttentionDropout* dropout);                               \
  void name##_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,         \
                       const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk, Tensor& dv, \
                       const kernels::AttentionDropout* dropout);
MOE_CP_ENTRY(p2p)
MOE_CP_ENTRY(a2a)
MOE_CP_ENTRY(allgather)
MOE_CP_ENTRY(a2a_p2p)
#undef MOE_CP_ENTRY

}  // namespace moecore::nn::cp_parts
