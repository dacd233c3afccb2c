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
  Tensor kv = Tensor::empty({2 * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype());
  kv.slice(0, R).copy_from(k);
  kv.slice(R, R).copy_from(v);
  Tensor all = Tensor::empty({C * 2 * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype());
  cp.group->all_gather(kv, all);
  K = Tensor::empty({C * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype());
  V = Tensor::empty(K.shape(), k.dtype());
  for (int64_t m = 0; m < C; m++) {
    const ChunkIds ids = balanced_chunks(m, C);
    for (int64_t i = 0; i < 2; i++) {
      chunk_rows(K, ids[static_cast<size_t>(i)], sc).copy_from(all.slice(m * 2 * R + i * sc, sc));
      chunk_rows(V, ids[static_cast<size_t>(i)], sc).copy_from(all.slice(m * 2 * R + R + i * sc, sc));
    }
  }
}

Tensor lse_piece(const Tensor& lse, int64_t c, int64_t sc, const Tensor* in) {
  const int64_t BN = lse.dim(0) * lse.dim(1), R = lse.dim(2);
  Tensor out = Tensor::empty({lse.dim(0), lse.dim(1), sc}, lse.dtype());
  MOE_DISPATCH_FLOAT(lse.dtype(), T, {
    T* l = lse.data<T>();
    T* o = out.data<T>();
    for (int64_t bn = 0; bn < BN; bn++) {
      if (in)
        std::copy_n(in->data<T>() + bn * sc, sc, l + bn * R + c * sc);
      else
        std::copy_n(l + bn * R + c * sc, sc, o + bn * sc);
    }
  });
  return out;
}

}  // namespace

void allgather_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const ContextParallel& cp,
                       Tensor& o, Tensor& lse, const kernels::AttentionDropout* dropout) {
  const int64_t sc = q.dim(0) / 2;
  Tensor K, V;
  gather_kv(k, v, cp, K, V);
  const ChunkIds mine = balanced_chunks(cp.rank, cp.size);
  Tensor l = Tensor::empty({q.dim(1), q.dim(2), sc}, q.dtype());
  for (int64_t i = 0; i < 2; i++) {
    const int64_t c = mine[static_cast<size_t>(i)], keys = (c + 1) * sc;
    Tensor oc = chunk_rows(o, i, sc);
    kernels::attention_block_forward(chunk_rows(q, i, sc), K.slice(0, keys), V.slice(0, keys), c * sc, 0, scale, oc, l,
                                     dropout, cp.bf16);
    lse_piece(lse, i, sc, &l);
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
  Tensor dkv = Tensor::zeros({2 * C * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype());
  dq.zero_();
  for (int64_t i = 0; i < 2; i++) {
    const int64_t c = mine[static_cast<size_t>(i)], keys = (c + 1) * sc;
    Tensor dqc = chunk_rows(dq, i, sc);
    Tensor dkb = Tensor::empty(K.slice(0, keys).shape(), k.dtype()), dvb = Tensor::empty(dkb.shape(), k.dtype());
    kernels::attention_block_backward(chunk_rows(dout, i, sc), chunk_rows(q, i, sc), K.slice(0, keys), V.slice(0, keys),
                                      chunk_rows(o, i, sc), lse_piece(lse, i, sc, nullptr), c * sc, 0, scale, dqc, dkb,
                                      dvb, dropout, cp.bf16);
    MOE_DISPATCH_FLOAT(dkv.dtype(), T, {
      T* a = dkv.data<T>();
      const T* gk = dkb.data<T>();
      const T* gv = dvb.data<T>();
      const int64_t n = dkb.numel(), off = C * R * dkb.numel() / keys;
      for (int64_t e = 0; e < n; e++) {
        a[e] += gk[e];
        a[off + e] += gv[e];
      }
    });
  }
  // Reduce-scatter in member order: member m gets [dK chunk m, dK chunk 2C−1−m, dV chunk m, dV chunk 2C−1−m].
  Tensor send = Tensor::empty(dkv.shape(), dkv.dtype());
  for (int64_t m = 0; m < C; m++) {
    const ChunkIds ids = balanced_chunks(m, C);
    for (int64_t i = 0; i < 2; i++) {
      const int64_t c = ids[static_cast<size_t>(i)];
      send.slice(m * 2 * R + i * sc, sc).copy_from(dkv.slice(c * sc, sc));
      send.slice(m * 2 * R + R + i * sc, sc).copy_from(dkv.slice(C * R + c * sc, sc));
    }
  }
  Tensor mine_dkv = Tensor::empty({2 * R, k.dim(1), k.dim(2), k.dim(3)}, k.dtype());
  cp.group->reduce_scatter(send, mine_dkv);
  dk.copy_from(mine_dkv.slice(0, R));
  dv.copy_from(mine_dkv.slice(R, R));
}

}  // namespace moecore::nn::cp_parts
