// Causal self-attention over context parallelism (--context-parallel-size C > 1). Each sequence is cut into 2C
// chunks of Sc = S/(2C) positions; context-parallel rank r holds chunks r and 2C−1−r (Megatron's load balancing for
// causal attention), so this rank's q/k/v rows are chunk r's Sc rows followed by chunk 2C−1−r's Sc rows. The result
// equals kernels::attention_forward on the whole sequence restricted to this rank's rows; no S×S buffer is formed.
// The communication pattern is --cp-comm-type's (Megatron's values):
//   p2p        ring: K/V blocks travel around the CP group, overlapped with the current block's compute;
//   a2a        all-to-all from sequence shards to head shards (DeepSpeed-Ulysses) and back;
//   allgather  K/V all-gathered; backward reduce-scatters dK/dV;
//   a2a+p2p    a2a inside groups of --hierarchical-context-parallel-sizes[0] ranks, p2p across them.
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/attention.h"

namespace moecore::comm {
class ProcessGroup;
}

namespace moecore::nn {

enum class CpCommType { P2P, A2A, AllGather, A2AP2P };

struct ContextParallel {
  const comm::ProcessGroup* group = nullptr;  // the CP group (size C); rank = CP rank r
  int64_t size = 1, rank = 0;
  CpCommType comm_type = CpCommType::P2P;
  // a2a+p2p only: the inner (a2a) and outer (p2p) groups of --hierarchical-context-parallel-sizes.
  const comm::ProcessGroup* inner = nullptr;
  const comm::ProcessGroup* outer = nullptr;
  // --bf16: operands rounded to bf16 as kernels::attention_forward_bf16 does (a2a's full-sequence attention uses
  // attention_forward_bf16 itself; p2p and allgather the block kernel: native bf16 block products where that kernel
  // is FlashNative, else the flash block kernel's f32 products on rounded operands).
  bool bf16 = false;
  bool on() const { return size > 1; }
  // Global position of this rank's local row i of a sequence of `S` positions (chunk layout above).
  int64_t position(int64_t i, int64_t S) const {
    const int64_t sc = S / (2 * size);
    return i < sc ? rank * sc + i : (2 * size - 1 - rank) * sc + (i - sc);
  }
};

// q [2·Sc, B, Nq, D], k/v [2·Sc, B, Nkv, D] (this rank's rows) -> o [2·Sc, B, Nq, D], lse [B, Nq, 2·Sc] (kept for
// backward). Collective over cp.group. `dropout`: as kernels::attention_forward's, keyed by global positions.
void context_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                               const ContextParallel& cp, Tensor& o, Tensor& lse,
                               const kernels::AttentionDropout* dropout = nullptr);
// dout like o -> dq, dk, dv (written) for this rank's rows. Collective over cp.group.
void context_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk,
                                Tensor& dv, const kernels::AttentionDropout* dropout = nullptr);

}  // namespace moecore::nn
