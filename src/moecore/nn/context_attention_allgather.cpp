// --cp-comm-type allgather (Megatron/TransformerEngine's AttnFuncWithCPAndKVAllGather): the K/V of every CP rank
// are all-gathered and put in sequence order; each of this rank's two query chunks attends the keys up to its own
// end with the block kernel (one block per chunk: no merge). Backward: each chunk's dK/dV over the whole prefix are
// summed into full-sequence buffers, which a reduce-scatter returns to the ranks owning the rows.
#include <algorithm>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/attention.h"
#include "moecore/nn/context_attention_parts.h"

namespace moecore::nn::cp_parts {

namespace {

// Full-sequence K and V ([S, B, Nkv, D] each, S = 2C·sc) from every rank's K/V rows.
void gather_kv(const Tensor& k, const Tensor& v, const ContextParallel& cp, Tensor& K, Tensor& V) {
  const int64_t C = cp.size, R = k.dim(0), sc = R / 2;
  const Device dev = k.device();
  Tensor kv = Tensor::empty({2 * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), dev);
  kv.slice(0, R).copy_from(k);
  kv.slice(R, R).copy_from(v);
  Tensor all = Tensor::empty({C * 2 * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), dev);
  cp.group->all_gather(kv, all);
  K = Tensor::empty({C * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), dev);
  V = Tensor::empty(K.shape(), k.dtype(), dev);
  for (int64_t m = 0; m < C; m++) {
    const ChunkIds ids = balanced_chunks(m, C);
    for (int64_t i = 0; i < 2; i++) {
      chunk_rows(K, ids[static_cast<size_t>(i)], sc).copy_from(all.slice(m * 2 * R + i * sc, sc));
      chunk_rows(V, ids[static_cast<size_t>(i)], sc).copy_from(all.slice(m * 2 * R + R + i * sc, sc));
    }
  }
}

}  // namespace

void allgather_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const ContextParallel& cp,
                       Tensor& o, Tensor& lse, const kernels::AttentionDropout* dropout) {
  const int64_t sc = q.dim(0) / 2;
  Tensor K, V;
  gather_kv(k, v, cp, K, V);
  const ChunkIds mine = balanced_chunks(cp.rank, cp.size);
  Tensor l = Tensor::empty({q.dim(1), q.dim(2), sc}, q.dtype(), q.device());
  for (int64_t i = 0; i < 2; i++) {
    const int64_t c = mine[static_cast<size_t>(i)], keys = (c + 1) * sc;
    Tensor oc = chunk_rows(o, i, sc);
    kernels::attention_block_forward(chunk_rows(q, i, sc), K.slice(0, keys), V.slice(0, keys), c * sc, 0, scale, oc, l,
                                     dropout, cp.bf16);
    set_lse_columns(lse, i, sc, l);
  }
}

void allgather_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk, Tensor& dv,
                        const kernels::AttentionDropout* dropout) {
  const int64_t C = cp.size, R = q.dim(0), sc = R / 2;
  Tensor K, V;
  gather_kv(k, v, cp, K, V);
  const ChunkIds mine = balanced_chunks(cp.rank, cp.size);
  // dK then dV of the whole sequence, in sequence order.
  const Device dev = k.device();
  Tensor dkv = Tensor::zeros({2 * C * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), dev);
  dq.zero_();
  for (int64_t i = 0; i < 2; i++) {
    const int64_t c = mine[static_cast<size_t>(i)], keys = (c + 1) * sc;
    Tensor dqc = chunk_rows(dq, i, sc);
    Tensor dkb = Tensor::empty(K.slice(0, keys).shape(), k.dtype(), dev);
    Tensor dvb = Tensor::empty(dkb.shape(), k.dtype(), dev);
    kernels::attention_block_backward(chunk_rows(dout, i, sc), chunk_rows(q, i, sc), K.slice(0, keys), V.slice(0, keys),
                                      chunk_rows(o, i, sc), lse_columns(lse, i, sc), c * sc, 0, scale, dqc, dkb, dvb,
                                      dropout, cp.bf16);
    Tensor dk_prefix = dkv.slice(0, keys), dv_prefix = dkv.slice(C * R, keys);
    kernels::add_(dk_prefix, dkb);
    kernels::add_(dv_prefix, dvb);
  }
  // Reduce-scatter in member order: member m gets [dK chunk m, dK chunk 2C−1−m, dV chunk m, dV chunk 2C−1−m].
  Tensor send = Tensor::empty(dkv.shape(), dkv.dtype(), dev);
  for (int64_t m = 0; m < C; m++) {
    const ChunkIds ids = balanced_chunks(m, C);
    for (int64_t i = 0; i < 2; i++) {
      const int64_t c = ids[static_cast<size_t>(i)];
      send.slice(m * 2 * R + i * sc, sc).copy_from(dkv.slice(c * sc, sc));
      send.slice(m * 2 * R + R + i * sc, sc).copy_from(dkv.slice(C * R + c * sc, sc));
    }
  }
  Tensor mine_dkv = Tensor::empty({2 * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), dev);
  cp.group->reduce_scatter(send, mine_dkv);
  dk.copy_from(mine_dkv.slice(0, R));
  dv.copy_from(mine_dkv.slice(R, R));
}

}  // namespace moecore::nn::cp_parts
