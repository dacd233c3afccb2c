// Muon (see muon.h).
#include "moecore/optim/muon.h"

#include <map>

#include "moecore/core/error.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/optim/grad_buffer.h"
#include "moecore/optim/newton_schulz.h"

namespace moecore::optim {

namespace {
bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// torch.lerp: start + w·(end − start), computed from the nearer end as torch does.
inline float lerp(float start, float end, float w) {
  return w < 0.5f ? start + w * (end - start) : end - (end - start) * (1.0f - w);
}

bool grouped_expert(const nn::Parameter& p) {
  return p.expert_parallel && p.value.ndim() == 3;
}

// A member's matrices as orthogonalised: `experts` matrices of [rows, cols], laid out in `mat` [experts, rows·cols].
struct Matrices {
  int64_t experts = 1, rows = 0, cols = 0;
  Tensor mat;
  bool gathered = false;
};
}  // namespace

bool is_muon_matrix(const nn::Parameter& p) {
  if (p.name.rfind("embedding.", 0) == 0 || p.name.rfind("output_layer.", 0) == 0) return false;
  // An expert parameter is a matrix per expert when 3-D; the experts' biases [E, N] are vectors per expert.
  return p.expert_parallel ? grouped_expert(p) : p.value.ndim() == 2;
}

Muon::Muon(std::vector<nn::Parameter*> params, size_t num_buckets, const BucketOf& bucket_of,
           const comm::ProcessGroup* group, const comm::ProcessGroup* tp, std::vector<double> norm_weights,
           const MuonConfig& cfg, bool layer_wise, int64_t bucket_size)
    : params_(std::move(params)),
      buckets_(params_, num_buckets, bucket_of, group, bucket_size),
      group_(group),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      weights_(std::move(norm_weights)),
      cfg_(cfg),
      layer_wise_(layer_wise && group && group->size() > 1) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) {
    MOE_ASSERT_MSG(is_muon_matrix(*params_[i]) && params_[i]->math_dtype() == DType::F32, "{} is not a Muon matrix",
                   params_[i]->name);
    index[params_[i]->name] = i;
  }
  std::vector<bool> used(params_.size(), false);
  for (size_t i = 0; i < params_.size(); i++) {
    if (used[i]) continue;
    Unit u;
    const std::string& n = params_[i]->name;
    const std::string q = ".linear_q.weight";
    if (!cfg_.split_qkv && ends_with(n, q)) {  // q, k, v of one layer: one matrix (Megatron's fused linear_qkv)
      const std::string prefix = n.substr(0, n.size() - q.size());
      for (const char* s : {".linear_q.weight", ".linear_k.weight", ".linear_v.weight"}) {
        auto it = index.find(prefix + s);
        MOE_ASSERT_MSG(it != index.end(), "no {}{} beside {}", prefix, s, n);
        u.members.push_back(it->second);
      }
    } else if (!cfg_.split_qkv && (ends_with(n, ".linear_k.weight") || ends_with(n, ".linear_v.weight")) &&
               index.count(n.substr(0, n.size() - 16) + q)) {
      continue;  // joins its layer's q
    } else {
      u.members.push_back(i);
    }
    for (size_t m : u.members) used[m] = true;
    units_.push_back(u);
  }
  // Layer-wise ownership: each matrix to the least-loaded rank so far (by elements), the same on every rank.
  if (layer_wise_) {
    std::vector<int64_t> load(static_cast<size_t>(group_->size()), 0);
    for (auto& u : units_) {
      size_t best = 0;
      for (size_t r = 1; r < load.size(); r++)
        if (load[r] < load[best]) best = r;
      u.owner = static_cast<int64_t>(best);
      for (size_t m : u.members) load[best] += params_[m]->value.numel();
    }
  }
  buf_.resize(params_.size());
  master_.resize(params_.size());
  for (const auto& u : units_)
    for (size_t m : u.members) {
      nn::Parameter& p = *params_[m];
      if (owns(u)) buf_[m] = Tensor::zeros(p.value.shape(), DType::F32);
      if (!is_half(storage_dtype(p))) continue;
      // The f32 value becomes the owner's master; every rank's model keeps it rounded.
      if (owns(u)) master_[m] = p.value.to(Device::cpu()).clone();
      p.value = p.value.to(storage_dtype(p));
      p.low_cache = Tensor();
    }
}

void Muon::gather_master(std::vector<Tensor>& w) const {
  w.assign(params_.size(), Tensor());
  for (const auto& u : units_)
    for (size_t i : u.members) {
      const nn::Parameter& p = *params_[i];
      if (!is_half(p.value.dtype())) {  // f32: the value is the master
        w[i] = p.value.to(Device::cpu()).clone();
        continue;
      }
      w[i] = master_[i].defined() ? master_[i].clone() : Tensor::zeros(p.value.shape(), DType::F32);
      if (layer_wise_) group_->broadcast(w[i], u.owner);
    }
}

std::vector<double> Muon::master_squares() const {
  std::vector<double> sq(params_.size(), 0.0);
  const double shards = layer_wise_ ? static_cast<double>(group_->size()) : 1.0;  // the owner counts for all
  for (size_t i = 0; i < params_.size(); i++) {
    const nn::Parameter& p = *params_[i];
    if (!is_half(p.value.dtype()))
      sq[i] = kernels::sum_squares(p.value);
    else if (master_[i].defined())
      sq[i] = shards * kernels::sum_squares(master_[i]);
  }
  return sq;
}

void Muon::load_master(const std::vector<Tensor>& w) {
  MOE_ASSERT(w.size() == params_.size());
  for (size_t i = 0; i < params_.size(); i++) {
    if (master_[i].defined()) master_[i].copy_from(w[i]);
    params_[i]->value.copy_from(w[i]);  // rounded where stored in bf16
  }
}

bool Muon::owns(const Unit& u) const {
  return !layer_wise_ || u.owner == group_->rank();
}

double Muon::zero_share() const {
  double z = 0;
  for (size_t i = 0; i < params_.size(); i++)
    z += weights_[i] * static_cast<double>(kernels::count_zeros(params_[i]->grad));
  return z;
}

void Muon::reduce_gradients(double scale, float unscale, kernels::ClipState& clip) {
  buckets_.finish(scale);
  std::vector<Tensor> grads;
  for (auto* p : params_) grads.push_back(p->grad);
  if (unscale != 1.0f)
    for (Tensor& g : grads) kernels::scale_(g, unscale);
  kernels::squares_add_part(clip, grads, weights_);
}

void Muon::orthogonalize(const Unit& u, std::vector<Tensor>& upd) const {
  std::vector<Matrices> ms;
  for (size_t k = 0; k < u.members.size(); k++) {
    const nn::Parameter& p = *params_[u.members[k]];
    const Tensor& local = upd[k];
    Matrices m;
    m.experts = grouped_expert(p) ? p.value.shape()[0] : 1;
    m.gathered = tp_ && p.tensor_parallel && !cfg_.blockwise;
    if (m.gathered) {  // the global matrix, from every TP rank's box (summed: the boxes are disjoint)
      const Shape& gv = p.global_view;
      const int64_t per = gv.numel() / (grouped_expert(p) ? gv[0] : 1);
      const int64_t first = grouped_expert(p) ? p.box_offset[0] : 0;
      m.cols = gv[gv.ndim() - 1];
      m.rows = per / m.cols;
      m.mat = Tensor::zeros({m.experts, per}, DType::F32);
      float* dst = m.mat.data<float>();
      const float* src = local.data<float>();
      for (int64_t i = 0; i < local.numel(); i++) {
        const int64_t gi = p.global_index(i);
        dst[(gi / per - first) * per + gi % per] = src[i];
      }
      tp_->all_reduce(m.mat);
    } else {
      m.cols = local.shape()[local.ndim() - 1];
      m.rows = local.numel() / m.experts / m.cols;
      m.mat = local.clone().reshape({m.experts, m.rows * m.cols});
    }
    ms.push_back(std::move(m));
  }
  const int64_t cols = ms[0].cols;
  int64_t rows = 0;
  for (const auto& m : ms) {
    MOE_ASSERT(m.cols == cols && m.experts == ms[0].experts);
    rows += m.rows;
  }
  const double scale = muon_scale_factor(rows, cols, cfg_.scale_mode) * cfg_.extra_scale_factor;
  Tensor stack = Tensor::empty({rows, cols}, DType::F32);
  for (int64_t e = 0; e < ms[0].experts; e++) {
    int64_t off = 0;
    for (const auto& m : ms) {
      std::copy_n(m.mat.data<float>() + e * m.rows * cols, m.rows * cols, stack.data<float>() + off);
      off += m.rows * cols;
    }
    const Tensor r = newton_schulz(stack, cfg_.num_ns_steps, cfg_.coefficient_type, cfg_.bf16_matmul);
    off = 0;
    for (auto& m : ms) {
      float* dst = m.mat.data<float>() + e * m.rows * cols;
      const float* src = r.data<float>() + off;
      for (int64_t i = 0; i < m.rows * cols; i++) dst[i] = static_cast<float>(src[i] * scale);
      off += m.rows * cols;
    }
  }
  for (size_t k = 0; k < u.members.size(); k++) {
    const nn::Parameter& p = *params_[u.members[k]];
    const Matrices& m = ms[k];
    float* dst = upd[k].data<float>();
    const float* src = m.mat.data<float>();
    if (!m.gathered) {
      std::copy_n(src, upd[k].numel(), dst);
      continue;
    }
    const int64_t per = m.rows * m.cols;
    const int64_t first = grouped_expert(p) ? p.box_offset[0] : 0;
    for (int64_t i = 0; i < upd[k].numel(); i++) {
      const int64_t gi = p.global_index(i);
      dst[i] = src[(gi / per - first) * per + gi % per];
    }
  }
}

void Muon::step(const kernels::AdamWParams& hp, int64_t /*step*/) {
  const auto beta = static_cast<float>(cfg_.momentum), gs = static_cast<float>(hp.grad_scale);
  const auto lr = static_cast<float>(hp.lr);
  for (const auto& u : units_) {
    if (!owns(u)) continue;
    // A matrix on the GPU is updated on host copies of its weight and gradient, then copied back: Newton–Schulz
    // (bf16 products by default) amplifies any difference in the products' rounding, so it runs where the CPU's
    // does and the GPU trains the CPU's bits (docs/differences.md).
    std::vector<Tensor> upd, w_host;
    for (size_t m : u.members) {
      nn::Parameter& p = *params_[m];
      // A bf16-stored matrix is updated on its f32 master (on the host); to(cpu) is the tensor itself on the host.
      w_host.push_back(master_[m].defined() ? master_[m] : p.value.to(Device::cpu()));
      const Tensor g_host = p.grad.to(Device::cpu());
      float* w = w_host.back().data<float>();
      const float* g = g_host.data<float>();
      float* b = buf_[m].data<float>();
      const int64_t n = p.value.numel();
      if (hp.weight_decay > 0 && !p.no_weight_decay) {
        const auto s = static_cast<float>(hp.lr * hp.weight_decay);
        for (int64_t i = 0; i < n; i++) w[i] += -s * w[i];
      }
      Tensor t = Tensor::empty(p.value.shape(), DType::F32);
      float* o = t.data<float>();
      for (int64_t i = 0; i < n; i++) {
        const float gi = g[i] * gs;
        b[i] = lerp(b[i], gi, 1.0f - beta);
        o[i] = cfg_.nesterov ? lerp(gi, b[i], beta) : b[i];
      }
      upd.push_back(std::move(t));
    }
    orthogonalize(u, upd);
    for (size_t k = 0; k < u.members.size(); k++) {
      float* w = w_host[k].data<float>();
      const float* o = upd[k].data<float>();
      for (int64_t i = 0; i < upd[k].numel(); i++) w[i] += -lr * o[i];
      Tensor& value = params_[u.members[k]]->value;
      if (!value.shares_storage(w_host[k])) value.copy_from(w_host[k]);  // a copy (rounded where stored in bf16)
    }
  }
  if (layer_wise_)  // every rank takes the owners' updated weights
    for (const auto& u : units_)
      for (size_t m : u.members) group_->broadcast(params_[m]->value, u.owner);
}

void Muon::gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const {
  m.assign(params_.size(), Tensor());
  v.assign(params_.size(), Tensor());
  for (const auto& u : units_) {
    for (size_t i : u.members) {
      m[i] = owns(u) ? buf_[i].clone() : Tensor::zeros(params_[i]->value.shape(), DType::F32);
      if (layer_wise_) group_->broadcast(m[i], u.owner);
      v[i] = Tensor::zeros(params_[i]->value.shape(), DType::F32);
    }
  }
}

void Muon::load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& /*v*/) {
  MOE_ASSERT(m.size() == params_.size());
  for (const auto& u : units_)
    if (owns(u))
      for (size_t i : u.members) {
        MOE_ASSERT(m[i].numel() == params_[i]->value.numel());
        buf_[i] = m[i].clone().reshape(params_[i]->value.shape());
      }
}

}  // namespace moecore::optim
