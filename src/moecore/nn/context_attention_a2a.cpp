// --cp-comm-type a2a (DeepSpeed-Ulysses, as TransformerEngine's AttnFuncWithCPAndQKVOA2A): an all-to-all turns this
// rank's rows of every head into every row of Nq/C heads; the chunks are put back in sequence order and the
// single-rank kernel (kernels::attention_forward, or attention_forward_bf16 under --bf16) runs on the whole
// sequence of those heads; the result goes back the same way. Query heads must divide by C. K/V heads that do not
// divide by C are repeated for their query heads first (each rank then gets the kv head of each of its query
// heads) and their gradients summed back. Dropout: head_offset moves to this rank's first head. Also the
// sequence ↔ head all-to-all and the small helpers the other comm types share (context_attention_parts.h).
// GPU tensors: the layout work and the all-to-all run on host copies (the transport is host-staged anyway); the
// attention kernel runs on the GPU on the head shards moved there.
#include <algorithm>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/attention.h"
#include "moecore/nn/context_attention_parts.h"

namespace moecore::nn::cp_parts {

namespace {

// Copies heads [h0, h0+n) of every row of x [R, B, N, D] into y rows [y0, y0+R) ([*, B, n, D]), or back (to_x).
void copy_heads(const Tensor& x, int64_t h0, int64_t n, const Tensor& y, int64_t y0, bool to_x) {
  const int64_t R = x.dim(0), B = x.dim(1), N = x.dim(2), D = x.dim(3);
  const size_t es = dtype_size(x.dtype());
  char* xp = static_cast<char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t i = 0; i < R; i++)
    for (int64_t b = 0; b < B; b++) {
      char* xs = xp + static_cast<size_t>(((i * B + b) * N + h0) * D) * es;
      char* ys = yp + static_cast<size_t>((((y0 + i) * B + b) * n) * D) * es;
      const size_t bytes = static_cast<size_t>(n * D) * es;
      if (to_x)
        std::copy_n(ys, bytes, xs);
      else
        std::copy_n(xs, bytes, ys);
    }
}

// Rows in chunk order `ids` (each chunk sc rows) <-> rows in sequence order.
Tensor reorder(const Tensor& x, const ChunkIds& ids, int64_t sc, bool to_natural) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  for (size_t i = 0; i < ids.size(); i++) {
    const int64_t idx = static_cast<int64_t>(i), c = ids[i];
    if (to_natural)
      chunk_rows(out, c, sc).copy_from(chunk_rows(x, idx, sc));
    else
      chunk_rows(out, idx, sc).copy_from(chunk_rows(x, c, sc));
  }
  return out;
}

ChunkIds all_balanced(int64_t C) {
  ChunkIds ids;
  for (int64_t m = 0; m < C; m++)
    for (int64_t c : balanced_chunks(m, C)) ids.push_back(c);
  return ids;
}

Tensor to_heads(const Tensor& x, const comm::ProcessGroup& g, const ChunkIds& ids, int64_t sc) {
  return reorder(seq_to_heads(x, g), ids, sc, true);
}
Tensor to_seq(const Tensor& x, const comm::ProcessGroup& g, const ChunkIds& ids, int64_t sc) {
  return heads_to_seq(reorder(x, ids, sc, false), g);
}

// For tensors on any device (the layout work and the all-to-all on a host copy, the head shard back on x's device):
// x's head shard, and K/V's with their heads expanded for Nq query heads first.
Tensor heads_of(const Tensor& x, const comm::ProcessGroup& g, const ChunkIds& ids, int64_t sc) {
  return to_device_of(to_heads(on_host(x), g, ids, sc), x);
}
Tensor kv_heads_of(const Tensor& kv, int64_t Nq, const comm::ProcessGroup& g, const ChunkIds& ids, int64_t sc) {
  return to_device_of(to_heads(expand_kv_heads(on_host(kv), Nq, g.size()), g, ids, sc), kv);
}

}  // namespace

void check_heads(int64_t Nq, int64_t G, const char* what) {
  MOE_CHECK(Nq % G == 0,
            "--cp-comm-type {}: the {} attention heads of this rank do not divide by the {} ranks of its all-to-all; "
            "use a head count divisible by {} or --cp-comm-type p2p/allgather",
            what, Nq, G, G);
}

Tensor seq_to_heads(const Tensor& x, const comm::ProcessGroup& g) {
  const int64_t G = g.size(), R = x.dim(0), n = x.dim(2) / G;
  Tensor send = Tensor::empty({G * R, x.dim(1), n, x.dim(3)}, x.dtype());
  for (int64_t m = 0; m < G; m++) copy_heads(x, m * n, n, send, m * R, false);
  Tensor out = Tensor::empty(send.shape(), x.dtype());
  const std::vector<int64_t> rows(static_cast<size_t>(G), R);
  g.all_to_all_v(send, rows, out, rows);
  return out;
}

Tensor heads_to_seq(const Tensor& x, const comm::ProcessGroup& g) {
  const int64_t G = g.size(), R = x.dim(0) / G, n = x.dim(2);
  Tensor got = Tensor::empty(x.shape(), x.dtype());
  const std::vector<int64_t> rows(static_cast<size_t>(G), R);
  g.all_to_all_v(x, rows, got, rows);
  Tensor out = Tensor::empty({R, x.dim(1), G * n, x.dim(3)}, x.dtype());
  for (int64_t m = 0; m < G; m++) copy_heads(out, m * n, n, got, m * R, true);
  return out;
}

Tensor lse_rows(const Tensor& lse) {
  const int64_t B = lse.dim(0), N = lse.dim(1), R = lse.dim(2);
  Tensor out = Tensor::empty({R, B, N, 1}, lse.dtype());
  MOE_DISPATCH_FLOAT(lse.dtype(), T, {
    const T* in = lse.data<T>();
    T* o = out.data<T>();
    for (int64_t bn = 0; bn < B * N; bn++)
      for (int64_t i = 0; i < R; i++) o[i * B * N + bn] = in[bn * R + i];
  });
  return out;
}

Tensor lse_from_rows(const Tensor& rows) {
  const int64_t R = rows.dim(0), B = rows.dim(1), N = rows.dim(2);
  Tensor out = Tensor::empty({B, N, R}, rows.dtype());
  MOE_DISPATCH_FLOAT(rows.dtype(), T, {
    const T* in = rows.data<T>();
    T* o = out.data<T>();
    for (int64_t bn = 0; bn < B * N; bn++)
      for (int64_t i = 0; i < R; i++) o[bn * R + i] = in[i * B * N + bn];
  });
  return out;
}

Tensor expand_kv_heads(const Tensor& kv, int64_t Nq, int64_t G) {
  const int64_t Nkv = kv.dim(2);
  if (Nkv % G == 0) return kv;
  const int64_t R = kv.dim(0), B = kv.dim(1), D = kv.dim(3), grp = Nq / Nkv;
  Tensor out = Tensor::empty({R, B, Nq, D}, kv.dtype());
  const size_t es = dtype_size(kv.dtype()), bytes = static_cast<size_t>(D) * es;
  const char* in = static_cast<const char*>(kv.raw());
  char* o = static_cast<char*>(out.raw());
  for (int64_t rb = 0; rb < R * B; rb++)
    for (int64_t h = 0; h < Nq; h++)
      std::copy_n(in + static_cast<size_t>(rb * Nkv + h / grp) * bytes, bytes,
                  o + static_cast<size_t>(rb * Nq + h) * bytes);
  return out;
}

Tensor reduce_kv_heads(const Tensor& dkv, int64_t Nkv) {
  const int64_t Nq = dkv.dim(2);
  if (Nq == Nkv) return dkv;
  const int64_t R = dkv.dim(0), B = dkv.dim(1), D = dkv.dim(3), grp = Nq / Nkv;
  Tensor out = Tensor::zeros({R, B, Nkv, D}, dkv.dtype());
  MOE_DISPATCH_FLOAT(dkv.dtype(), T, {
    const T* in = dkv.data<T>();
    T* o = out.data<T>();
    for (int64_t rb = 0; rb < R * B; rb++)
      for (int64_t h = 0; h < Nq; h++)
        for (int64_t e = 0; e < D; e++) o[(rb * Nkv + h / grp) * D + e] += in[(rb * Nq + h) * D + e];
  });
  return out;
}

std::vector<int64_t> gather_ints(int64_t mine, const comm::ProcessGroup& g) {
  Tensor in = Tensor::empty({1}, DType::I64), out = Tensor::empty({g.size()}, DType::I64);
  in.data<int64_t>()[0] = mine;
  g.all_gather(in, out);
  return std::vector<int64_t>(out.data<int64_t>(), out.data<int64_t>() + g.size());
}

void a2a_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const ContextParallel& cp, Tensor& o,
                 Tensor& lse, const kernels::AttentionDropout* dropout) {
  const comm::ProcessGroup& g = *cp.group;
  const int64_t C = cp.size, Nq = q.dim(2), sc = q.dim(0) / 2, n = Nq / C;
  check_heads(Nq, C, "a2a");
  const ChunkIds ids = all_balanced(C);
  const Tensor qh = heads_of(q, g, ids, sc), kh = kv_heads_of(k, Nq, g, ids, sc), vh = kv_heads_of(v, Nq, g, ids, sc);
  kernels::AttentionDropout drop;
  if (dropout) drop = head_shard(dropout, cp.rank * n);
  const kernels::AttentionDropout* dp = dropout ? &drop : nullptr;
  Tensor oh = Tensor::empty(qh.shape(), q.dtype(), q.device());
  Tensor lh = Tensor::empty({q.dim(1), n, qh.dim(0)}, q.dtype(), q.device());
  if (cp.bf16 && qh.dim(0) <= kernels::kMaxBf16AttentionSeq)
    kernels::attention_forward_bf16(qh, kh, vh, scale, oh, lh, dp);
  else
    kernels::attention_forward(qh, kh, vh, scale, oh, lh, dp);
  o.copy_from(to_seq(on_host(oh), g, ids, sc));
  lse.copy_from(lse_from_rows(to_seq(lse_rows(on_host(lh)), g, ids, sc)));
}

void a2a_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk, Tensor& dv,
                  const kernels::AttentionDropout* dropout) {
  const comm::ProcessGroup& g = *cp.group;
  const int64_t C = cp.size, Nq = q.dim(2), Nkv = k.dim(2), sc = q.dim(0) / 2, n = Nq / C;
  check_heads(Nq, C, "a2a");
  const ChunkIds ids = all_balanced(C);
  const Tensor qh = heads_of(q, g, ids, sc), doh = heads_of(dout, g, ids, sc), oh = heads_of(o, g, ids, sc);
  const Tensor kh = kv_heads_of(k, Nq, g, ids, sc), vh = kv_heads_of(v, Nq, g, ids, sc);
  const Tensor lh = to_device_of(lse_from_rows(to_heads(lse_rows(on_host(lse)), g, ids, sc)), q);
  kernels::AttentionDropout drop;
  if (dropout) drop = head_shard(dropout, cp.rank * n);
  const kernels::AttentionDropout* dp = dropout ? &drop : nullptr;
  const Device dev = q.device();
  Tensor dqh = Tensor::empty(qh.shape(), q.dtype(), dev), dkh = Tensor::empty(kh.shape(), q.dtype(), dev);
  Tensor dvh = Tensor::empty(vh.shape(), q.dtype(), dev);
  if (cp.bf16 && qh.dim(0) <= kernels::kMaxBf16AttentionSeq)
    kernels::attention_backward_bf16(doh, qh, kh, vh, oh, lh, scale, dqh, dkh, dvh, dp);
  else
    kernels::attention_backward(doh, qh, kh, vh, oh, lh, scale, dqh, dkh, dvh, dp);
  dq.copy_from(to_seq(on_host(dqh), g, ids, sc));
  dk.copy_from(reduce_kv_heads(to_seq(on_host(dkh), g, ids, sc), Nkv));
  dv.copy_from(reduce_kv_heads(to_seq(on_host(dvh), g, ids, sc), Nkv));
}

}  // namespace moecore::nn::cp_parts
