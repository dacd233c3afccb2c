// Position embedding module (see position_embedding.h). y = h + P[pos] is linear in both: dh = dy (unchanged, so
// backward leaves the activation gradient alone), dP[pos] += Σ_b dy.
#include "moecore/nn/position_embedding.h"

#include "moecore/kernels/position_rows.h"

namespace moecore::nn {

PositionEmbeddingType parse_position_embedding_type(std::string_view s) {
  if (s == "learned_absolute") return PositionEmbeddingType::LearnedAbsolute;
  if (s == "rope") return PositionEmbeddingType::Rope;
  MOE_CHECK(s == "none",
            "--position-embedding-type {} is refused: moecore has learned_absolute, rope and none (YaRN comes "
            "with --multi-latent-attention --rope-type yarn; mrope and relative are not offered)",
            s);
  return PositionEmbeddingType::None;
}

PositionEmbedding::PositionEmbedding(ParamRegistry& reg, const std::string& name, int64_t max_positions, int64_t hidden,
                                     double init_std, TPContext tp)
    : tp_(tp) {
  weight_ = &reg.add(name + ".weight", {max_positions, hidden}, InitRule::normal(init_std));
}

void PositionEmbedding::forward_(Tensor& h_SBH, Stash& st) {
  const Tensor& table = weight_->value;
  const int64_t S = h_SBH.dim(0), H = table.dim(1);
  MOE_ASSERT(h_SBH.ndim() == 3 && h_SBH.dim(2) == H && h_SBH.dtype() == table.dtype());
  st.s0 = tp_.rank() * S;
  MOE_CHECK(st.seq.size * (st.s0 + S) <= table.dim(0), "sequence length {} exceeds --max-position-embeddings {}",
            st.seq.size * tp_.size() * S, table.dim(0));
  st.seq.runs(st.s0, S, S * tp_.size(), [&](int64_t r, int64_t p, int64_t n) {
    Tensor rows = h_SBH.slice(r - st.s0, n);
    kernels::position_add_rows(rows, table.slice(p, n));
  });
}

void PositionEmbedding::backward(const Tensor& dh_SBH, Stash& st) {
  Tensor& grad = weight_->grad_to_add();
  const int64_t S = dh_SBH.dim(0), H = grad.dim(1);
  MOE_ASSERT(dh_SBH.ndim() == 3 && dh_SBH.dim(2) == H && st.seq.size * (st.s0 + S) <= grad.dim(0));
  st.seq.runs(st.s0, S, S * tp_.size(), [&](int64_t r, int64_t p, int64_t n) {
    Tensor g = grad.slice(p, n);
    kernels::position_sum_rows(dh_SBH.slice(r - st.s0, n), g);
  });
}

}  // namespace moecore::nn
