// Fine-grained activation offloading (Megatron's --fine-grained-activation-offloading --offload-modules,
// megatron/core/pipeline_parallel/fine_grained_activation_offload.py): after a layer's training forward, the tensors
// the named modules keep in its stash are copied to pinned host memory on a copy stream of their own and their
// device memory released; before the layer's backward they are back, copied while the layer before it computes
// (each layer's backward starts the copy back of the next one's). Only where tensors live changes, never a bit.
// Modules and their stash tensors (as Megatron: each module's tensors saved for its backward):
//   attn_norm   the input norm's input (the layer's input) and statistics
//   qkv_linear  the q/k/v projections' input and the qk-norms' (MLA: the down and up projections' inputs, the
//               latent norms', the rope key under mla_up_proj recompute)
//   core_attn   the attention kernel's q, k, v, output and softmax statistics (the output only as attention keeps
//               it: in f32 the output projection's input too; under --bf16, and in MLA, not kept apart from it)
//   attn_proj   the output projection's input: the attention's output o (needs core_attn)
//   mlp_norm    the pre-MLP norm's input (the residual sum) and statistics
//   expert_fc1  the routed experts' fc1 input;  moe_act  fc1's output, the activation and the routing probabilities
//   fused_group_mlp  the routed experts' whole stash
// A tensor under --min-offloaded-tensor-size elements stays, and so does one whose memory another tensor of the
// stash that stays also holds (copying it would free nothing). A layer's tensors whose copy to the host has not
// been released when its backward comes are taken back as they are (the last layers of a forward).
// Copies: device::OffloadCopyStream on a GPU; on the CPU only with --testing-offload-on-cpu, into a host pool of its
// own (plain memory, outside the allocator whose bytes the plan counts), through the same steps.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "moecore/core/device.h"
#include "moecore/nn/stash_offload.h"
#include "moecore/train/config/config.h"

namespace moecore::device {
class OffloadCopyStream;
}

namespace moecore::train {

struct OffloadModules {
  bool attn_norm = false, qkv_linear = false, core_attn = false, attn_proj = false, mlp_norm = false;
  bool expert_fc1 = false, moe_act = false, fused_group_mlp = false;
  bool any() const {
    return attn_norm || qkv_linear || core_attn || attn_proj || mlp_norm || expert_fc1 || moe_act || fused_group_mlp;
  }
};

// The module a stash tensor belongs to (activation_offload_slots.cpp).
enum class OffloadModule { AttnNorm, QkvLinear, CoreAttn, AttnProj, MlpNorm, ExpertFc1, MoeAct };

struct OffloadConfig {
  OffloadModules modules;
  int64_t min_numel = 1024 * 1024;  // --min-offloaded-tensor-size
  int64_t max_inflight = 1;         // layers whose copies to the host run before compute waits for the oldest
};
// From the flags; modules all off when offloading is off, or on a CPU run without --testing-offload-on-cpu.
OffloadConfig offload_config(const TrainConfig& c, Device training_device);

class ActivationOffload : public nn::StashOffload {
 public:
  ActivationOffload(const OffloadConfig& cfg, Device d);
  ~ActivationOffload() override;
  void offload(nn::TransformerLayer::Stash& st) override;
  void reload(nn::TransformerLayer::Stash& st, nn::TransformerLayer::Stash* next) override;
  // Every copy to the host finished and its device memory released (the end of a forward pass, for tests).
  void drain();
  // Host memory: the bytes holding offloaded tensors now, their peak, and the pool's total (reused across steps).
  int64_t host_live_bytes() const;
  int64_t host_peak_bytes() const;
  int64_t host_pool_bytes() const;
  // Bytes copied to the host since construction (per tensor, aliases once).
  int64_t offloaded_bytes() const { return offloaded_bytes_; }

  struct Pool;  // host blocks by size, shared with the entries that hold them

 private:
  struct Pending {  // a layer's copy to the host whose device tensors are not released yet
    nn::OffloadedStash* rec = nullptr;
    uint64_t serial = 0;
    int64_t ticket = -1;
    std::vector<Tensor> tensors;  // by entry
  };
  void start_reload(nn::TransformerLayer::Stash& st);
  void release_oldest();
  OffloadConfig cfg_;
  Device dev_;
  std::unique_ptr<device::OffloadCopyStream> copies_;  // null on the CPU
  std::shared_ptr<Pool> pool_;
  std::deque<Pending> pending_;
  std::vector<Tensor*> slots_;  // scratch: a stash's offloadable tensors, their modules, which are copied
  std::vector<OffloadModule> modules_;
  std::vector<char> chosen_, keep_;
  uint64_t serial_ = 0;
  int64_t offloaded_bytes_ = 0;
};

// The offloadable tensors of a layer stash, in a fixed order (the slots OffloadedStash::Entry::slot counts), each
// with the module it belongs to; undefined ones included (activation_offload_slots.cpp).
void offload_slots(nn::TransformerLayer::Stash& st, std::vector<Tensor*>& slots, std::vector<OffloadModule>* modules);
bool offloads(const OffloadModules& m, OffloadModule which);

}  // namespace moecore::train
