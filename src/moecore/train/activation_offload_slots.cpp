// Which stash tensors each --offload-modules name covers (see activation_offload.h): the tensors each module's
// forward keeps for its backward, in one fixed order per layer stash. Attention and MLA are both listed (a layer
// fills one); an FFN's are the routed experts' of an MoE layer (a dense MLP has no offload module in Megatron).
#include "moecore/moe/moe_layer.h"
#include "moecore/train/activation_offload.h"

namespace moecore::train {

namespace {
void add(std::vector<Tensor*>& s, std::vector<OffloadModule>* m, OffloadModule which,
         std::initializer_list<Tensor*> ts) {
  for (Tensor* t : ts) {
    s.push_back(t);
    if (m) m->push_back(which);
  }
}
}  // namespace

void offload_slots(nn::TransformerLayer::Stash& st, std::vector<Tensor*>& s, std::vector<OffloadModule>* m) {
  s.clear();
  if (m) m->clear();
  using M = OffloadModule;
  add(s, m, M::AttnNorm, {&st.input_norm.x, &st.input_norm.mean, &st.input_norm.rstd});
  auto& a = st.attn;
  add(s, m, M::QkvLinear,
      {&a.q.x, &a.k.x, &a.v.x, &a.q_norm.x, &a.q_norm.mean, &a.q_norm.rstd, &a.k_norm.x, &a.k_norm.mean,
       &a.k_norm.rstd});
  // o_SBND is kept only in f32, where it is proj.x itself (it moves with attn_proj: a tensor another that stays
  // holds stays); under --bf16 o is kept only as proj.x.
  add(s, m, M::CoreAttn, {&a.q_SBND, &a.k_SBND, &a.v_SBND, &a.o_SBND, &a.lse_BNS});
  add(s, m, M::AttnProj, {&a.proj.x});
  auto& l = st.mla;
  add(s, m, M::QkvLinear,
      {&l.q_down.x, &l.q_up.x, &l.kv_down.x, &l.kv_up.x, &l.q_norm.x, &l.q_norm.mean, &l.q_norm.rstd, &l.kv_norm.x,
       &l.kv_norm.mean, &l.kv_norm.rstd, &l.kpe_SB1R});
  // MLA keeps no o_SBNA after forward (backward pads o again from proj.x); listed for a stash that holds one.
  add(s, m, M::CoreAttn, {&l.q_SBNA, &l.k_SBNA, &l.v_SBNA, &l.o_SBNA, &l.lse_BNS});
  add(s, m, M::AttnProj, {&l.proj.x});
  add(s, m, M::MlpNorm, {&st.pre_mlp_norm.x, &st.pre_mlp_norm.mean, &st.pre_mlp_norm.rstd});
  if (auto* moe_st = dynamic_cast<moe::MoELayer::Stash*>(st.ffn.get())) {
    auto& e = moe_st->experts;
    add(s, m, M::ExpertFc1, {&e.x_RH});
    add(s, m, M::MoeAct, {&e.h_RF1, &e.a_RF, &e.probs_R});
  }
}

bool offloads(const OffloadModules& m, OffloadModule which) {
  switch (which) {
    case OffloadModule::AttnNorm:
      return m.attn_norm;
    case OffloadModule::QkvLinear:
      return m.qkv_linear;
    case OffloadModule::CoreAttn:
      return m.core_attn;
    case OffloadModule::AttnProj:
      return m.attn_proj;
    case OffloadModule::MlpNorm:
      return m.mlp_norm;
    case OffloadModule::ExpertFc1:
      return m.expert_fc1 || m.fused_group_mlp;
    case OffloadModule::MoeAct:
      return m.moe_act || m.fused_group_mlp;
  }
  return false;
}

}  // namespace moecore::train
