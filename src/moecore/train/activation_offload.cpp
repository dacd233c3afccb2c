// Fine-grained activation offloading (see activation_offload.h). Ordering on a GPU, with no host synchronisation:
// a copy to the host waits for the compute stream's work so far (the tensors are written); the compute stream waits
// for that copy before the tensors' device memory is released (so no kernel reuses it while the copy reads it),
// --fine-grained-offloading-max-inflight-offloads layers later. A copy back goes into tensors allocated on the
// compute stream, after the compute stream's work so far (their memory's previous users are done); the compute
// stream waits for it before the layer's backward. One copy stream carries both directions, so a host block given
// back after its copy back is reused only by copies queued after it.
#include "moecore/train/activation_offload.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "moecore/core/allocator.h"
#include "moecore/core/error.h"
#include "moecore/device/offload_copy.h"
#include "moecore/train/config/device_support.h"

namespace moecore::train {

OffloadConfig offload_config(const TrainConfig& c, Device training_device) {
  OffloadConfig o;
  o.min_numel = c.min_offloaded_tensor_size;
  o.max_inflight =
      c.fine_grained_offloading_max_inflight_offloads < 0 ? 1 : c.fine_grained_offloading_max_inflight_offloads;
  if (!c.fine_grained_activation_offloading || !(offloading_applies(training_device) || c.testing_offload_on_cpu))
    return o;
  const auto has = [&](const char* m) {
    return std::find(c.offload_modules.begin(), c.offload_modules.end(), m) != c.offload_modules.end();
  };
  OffloadModules& m = o.modules;
  m.attn_norm = has("attn_norm"), m.qkv_linear = has("qkv_linear"), m.core_attn = has("core_attn");
  m.attn_proj = has("attn_proj"), m.mlp_norm = has("mlp_norm"), m.expert_fc1 = has("expert_fc1");
  m.moe_act = has("moe_act"), m.fused_group_mlp = has("fused_group_mlp");
  return o;
}

// Host blocks by rounded size: pinned memory on a GPU run, plain memory for the CPU's testing copies.
struct ActivationOffload::Pool {
  bool pinned = false;
  std::map<size_t, std::vector<void*>> free;
  int64_t live = 0, peak = 0, total = 0;
  ~Pool() {
    for (auto& [bytes, blocks] : free)
      for (void* p : blocks) pinned ? device::pinned_free(p) : std::free(p);
  }
  void* get(size_t bytes) {
    void* p = nullptr;
    auto& list = free[bytes];
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
    } else {
      p = pinned ? device::pinned_allocate(bytes) : std::aligned_alloc(64, bytes);
      MOE_CHECK(p != nullptr, "out of host memory for offloaded activations ({} bytes)", bytes);
      total += static_cast<int64_t>(bytes);
    }
    live += static_cast<int64_t>(bytes);
    peak = std::max(peak, live);
    return p;
  }
  void put(void* p, size_t bytes) {
    free[bytes].push_back(p);
    live -= static_cast<int64_t>(bytes);
  }
};

namespace {
std::shared_ptr<void> host_block(const std::shared_ptr<ActivationOffload::Pool>& pool, size_t nbytes) {
  const size_t bytes = Allocator::round_size(nbytes);
  return std::shared_ptr<void>(pool->get(bytes), [pool, bytes](void* p) { pool->put(p, bytes); });
}
}  // namespace

ActivationOffload::ActivationOffload(const OffloadConfig& cfg, Device d)
    : cfg_(cfg), dev_(d), pool_(std::make_shared<Pool>()) {
  pool_->pinned = offloading_applies(d);  // page-locked host memory and a copy stream for a GPU's stashes
  if (offloading_applies(d)) copies_ = std::make_unique<device::OffloadCopyStream>();
}

ActivationOffload::~ActivationOffload() {
  if (copies_) copies_->synchronize();  // no copy outlives the tensors and host blocks it reads or writes
}

int64_t ActivationOffload::host_live_bytes() const {
  return pool_->live;
}
int64_t ActivationOffload::host_peak_bytes() const {
  return pool_->peak;
}
int64_t ActivationOffload::host_pool_bytes() const {
  return pool_->total;
}

void ActivationOffload::offload(nn::TransformerLayer::Stash& st) {
  nn::OffloadedStash& rec = st.offloaded;
  MOE_ASSERT_MSG(rec.empty(), "a layer's stash offloaded twice before its backward");
  offload_slots(st, slots_, &modules_);
  const size_t n = slots_.size();
  chosen_.assign(n, 0);
  for (size_t i = 0; i < n; i++) {
    const Tensor& t = *slots_[i];
    chosen_[i] = offloads(cfg_.modules, modules_[i]) && t.defined() && t.device() == dev_ && t.numel() > 0 &&
                 t.numel() >= cfg_.min_numel;
  }
  // A tensor whose memory a tensor that stays also holds stays too: copying it would free nothing.
  keep_.assign(chosen_.begin(), chosen_.end());
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n && keep_[i]; j++)
      if (!chosen_[j] && slots_[j]->defined() && slots_[i]->shares_storage(*slots_[j])) keep_[i] = 0;
  if (std::find(keep_.begin(), keep_.end(), 1) == keep_.end()) return;
  if (copies_) copies_->wait_for_current();
  Pending p;
  rec.serial = p.serial = ++serial_;
  p.rec = &rec;
  for (size_t i = 0; i < n; i++) {
    if (!keep_[i]) continue;
    Tensor& t = *slots_[i];
    nn::OffloadedStash::Entry e;
    e.slot = i, e.shape = t.shape(), e.dtype = t.dtype();
    for (size_t k = 0; k < p.tensors.size() && e.alias_of < 0; k++)  // the same bytes seen twice: one copy
      if (p.tensors[k].raw() == t.raw() && p.tensors[k].nbytes() == t.nbytes() && p.tensors[k].dtype() == t.dtype())
        e.alias_of = static_cast<int64_t>(k);
    if (e.alias_of < 0) {
      e.host = host_block(pool_, t.nbytes());
      if (copies_)
        copies_->copy(e.host.get(), t.raw(), t.nbytes());
      else
        std::memcpy(e.host.get(), t.raw(), t.nbytes());
      offloaded_bytes_ += static_cast<int64_t>(t.nbytes());
    }
    rec.entries.push_back(std::move(e));
    p.tensors.push_back(std::move(t));
    t = Tensor();
  }
  p.ticket = copies_ ? copies_->record() : -1;
  pending_.push_back(std::move(p));
  while (static_cast<int64_t>(pending_.size()) > cfg_.max_inflight) release_oldest();
}

void ActivationOffload::release_oldest() {
  Pending& p = pending_.front();
  if (copies_) {
    copies_->current_waits(p.ticket);
    copies_->release(p.ticket);
  }
  pending_.pop_front();  // the device tensors go: the compute stream is ordered after their copy
}

void ActivationOffload::drain() {
  while (!pending_.empty()) release_oldest();
}

void ActivationOffload::start_reload(nn::TransformerLayer::Stash& st) {
  nn::OffloadedStash& rec = st.offloaded;
  rec.reloaded.clear();
  for (const auto& e : rec.entries)
    rec.reloaded.push_back(e.alias_of >= 0 ? rec.reloaded[static_cast<size_t>(e.alias_of)].reshape(e.shape)
                                           : Tensor::empty(e.shape, e.dtype, dev_));
  if (copies_) copies_->wait_for_current();
  for (size_t k = 0; k < rec.entries.size(); k++) {
    auto& e = rec.entries[k];
    if (e.alias_of >= 0) continue;
    Tensor& t = rec.reloaded[k];
    if (copies_)
      copies_->copy(t.raw(), e.host.get(), t.nbytes());
    else
      std::memcpy(t.raw(), e.host.get(), t.nbytes());
    e.host.reset();  // back to the pool: a later copy into it is queued after this one
  }
  rec.ticket = copies_ ? copies_->record() : 0;
}

void ActivationOffload::reload(nn::TransformerLayer::Stash& st, nn::TransformerLayer::Stash* next) {
  nn::OffloadedStash& rec = st.offloaded;
  const auto pending_of = [&](const nn::OffloadedStash& r) {
    return std::find_if(pending_.begin(), pending_.end(),
                        [&](const Pending& p) { return p.rec == &r && p.serial == r.serial; });
  };
  if (!rec.empty()) {
    offload_slots(st, slots_, nullptr);
    const auto it = pending_of(rec);
    if (it != pending_.end()) {  // its device tensors are still here: take them back as they are
      if (copies_) {
        copies_->current_waits(it->ticket);
        copies_->release(it->ticket);
      }
      for (size_t k = 0; k < rec.entries.size(); k++) *slots_[rec.entries[k].slot] = std::move(it->tensors[k]);
      pending_.erase(it);
    } else {
      if (rec.ticket < 0) start_reload(st);  // not prefetched
      if (copies_) {
        copies_->current_waits(rec.ticket);
        copies_->release(rec.ticket);
      }
      for (size_t k = 0; k < rec.entries.size(); k++) *slots_[rec.entries[k].slot] = std::move(rec.reloaded[k]);
    }
    rec.entries.clear();
    rec.reloaded.clear();
    rec.ticket = -1;
  }
  if (next && !next->offloaded.empty() && next->offloaded.ticket < 0 && pending_of(next->offloaded) == pending_.end())
    start_reload(*next);  // the next backward's tensors come back while this one computes
}

}  // namespace moecore::train
