// Attention over context parallelism, the interim implementation (see context_attention.h): every --cp-comm-type
// computes the same thing here, the simplest correct way. Forward all-gathers q, k, v over the CP group, puts the
// chunks in sequence order, runs kernels::attention_forward on the whole sequence and keeps this rank's rows.
// Backward all-gathers dO, o and lse too, runs the whole backward and keeps this rank's rows of dq, dk and dv (with
// all of dO every rank's whole-sequence gradients are complete, so nothing is reduced). No S×S buffer (the flash
// kernel), but every rank does the whole sequence's attention: the ring (p2p), a2a, allgather and a2a+p2p kernels
// replace this file.
#include "moecore/nn/context_attention.h"

#include <cstring>

#include "moecore/comm/process_group.h"
#include "moecore/core/error.h"
#include "moecore/nn/context_split.h"

namespace moecore::nn {

namespace {
// Copies chunk rows between rank order (rank r's L rows: chunk r, chunk 2C−1−r) and sequence order.
Tensor reorder(const Tensor& x, const ContextParallel& cp, bool to_sequence) {
  const int64_t C = cp.size, S = x.dim(0), sc = S / (2 * C);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const size_t row = static_cast<size_t>(x.numel() / S) * dtype_size(x.dtype()), chunk = row * static_cast<size_t>(sc);
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(y.raw());
  for (int64_t g = 0; g < 2 * C; g++) {
    const int64_t owner = g < C ? g : 2 * C - 1 - g, half = g < C ? 0 : 1;
    const size_t ranked = static_cast<size_t>(owner * 2 + half) * chunk, seq = static_cast<size_t>(g) * chunk;
    std::memcpy(dst + (to_sequence ? seq : ranked), src + (to_sequence ? ranked : seq), chunk);
  }
  return y;
}
// This rank's rows [L, ...] -> the whole sequence [C·L, ...] in sequence order.
Tensor gather_sequence(const Tensor& x, const ContextParallel& cp) {
  Shape shape = x.shape();
  shape.set(0, x.dim(0) * cp.size);
  Tensor all = Tensor::empty(shape, x.dtype());
  cp.group->all_gather(x, all);
  return reorder(all, cp, true);
}
// lse [B, N, L] <-> [L, B·N] (rows by position).
Tensor lse_rows(const Tensor& lse) {
  const int64_t BN = lse.dim(0) * lse.dim(1), L = lse.dim(2);
  Tensor y = Tensor::empty({L, BN}, lse.dtype());
  MOE_DISPATCH_FLOAT(lse.dtype(), T, {
    const T* s = lse.data<T>();
    T* d = y.data<T>();
    for (int64_t i = 0; i < BN; i++)
      for (int64_t l = 0; l < L; l++) d[l * BN + i] = s[i * L + l];
  });
  return y;
}
Tensor lse_from_rows(const Tensor& rows, int64_t B, int64_t N) {
  const int64_t L = rows.dim(0), BN = B * N;
  Tensor y = Tensor::empty({B, N, L}, rows.dtype());
  MOE_DISPATCH_FLOAT(rows.dtype(), T, {
    const T* s = rows.data<T>();
    T* d = y.data<T>();
    for (int64_t i = 0; i < BN; i++)
      for (int64_t l = 0; l < L; l++) d[i * L + l] = s[l * BN + i];
  });
  return y;
}
SeqSplit split_of(const ContextParallel& cp) {
  return SeqSplit{cp.size, cp.rank};
}
}  // namespace

void context_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                               const ContextParallel& cp, Tensor& o, Tensor& lse,
                               const kernels::AttentionDropout* dropout) {
  MOE_ASSERT(cp.on() && cp.group && q.ndim() == 4 && q.dim(0) % 2 == 0);
  const int64_t L = q.dim(0), B = q.dim(1), N = q.dim(2);
  const Tensor qa = gather_sequence(q, cp), ka = gather_sequence(k, cp), va = gather_sequence(v, cp);
  Tensor oa = Tensor::empty(qa.shape(), qa.dtype()), la = Tensor::empty({B, N, L * cp.size}, qa.dtype());
  kernels::attention_forward(qa, ka, va, scale, oa, la, dropout);
  o = rows_at_positions(oa, L, split_of(cp));
  lse = lse_from_rows(rows_at_positions(lse_rows(la), L, split_of(cp)), B, N);
}

void context_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk,
                                Tensor& dv, const kernels::AttentionDropout* dropout) {
  MOE_ASSERT(cp.on() && cp.group);
  const int64_t L = q.dim(0), B = q.dim(1), N = q.dim(2);
  const Tensor qa = gather_sequence(q, cp), ka = gather_sequence(k, cp), va = gather_sequence(v, cp);
  const Tensor oa = gather_sequence(o, cp), da = gather_sequence(dout, cp);
  const Tensor la = lse_from_rows(gather_sequence(lse_rows(lse), cp), B, N);
  Tensor dqa = Tensor::empty(qa.shape(), qa.dtype()), dka = Tensor::empty(ka.shape(), ka.dtype()),
         dva = Tensor::empty(va.shape(), va.dtype());
  kernels::attention_backward(da, qa, ka, va, oa, la, scale, dqa, dka, dva, dropout);
  // Every rank ran the whole backward (all of dO), so the whole-sequence gradients are complete here: keep this
  // rank's rows of each.
  for (auto [whole, part] : {std::pair{&dqa, &dq}, {&dka, &dk}, {&dva, &dv}}) {
    const Tensor mine = rows_at_positions(*whole, L, split_of(cp));
    MOE_ASSERT(mine.nbytes() == part->nbytes());
    std::memcpy(part->raw(), mine.raw(), mine.nbytes());
  }
}

}  // namespace moecore::nn
