// Position embedding module (see position_embedding.h). y = h + P[pos] is linear in both: dh = dy (unchanged, so
// backward leaves the activation gradient alone), dP[pos] += Σ_b dy.
#include "moecore/nn/position_embedding.h"

#include "moecore/kernels/cuda/position_rows.h"

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

namespace {
template <typename T>
void add_rows(T* h, const T* table, int64_t S, int64_t B, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; s++)
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < H; j++) h[(s * B + b) * H + j] += table[s * H + j];
}
// Fixed order per row: b ascending.
template <typename T>
void sum_rows(const T* dh, T* grad, int64_t S, int64_t B, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; s++)
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < H; j++) grad[s * H + j] += dh[(s * B + b) * H + j];
}
}  // namespace

void PositionEmbedding::forward_(Tensor& h_SBH, Stash& st) {
  const Tensor& table = weight_->value;
  const int64_t S = h_SBH.dim(0), B = h_SBH.dim(1), H = table.dim(1);
  MOE_ASSERT(h_SBH.ndim() == 3 && h_SBH.dim(2) == H && h_SBH.dtype() == table.dtype());
  st.s0 = tp_.rank() * S;
  MOE_CHECK(st.seq.size * (st.s0 + S) <= table.dim(0), "sequence length {} exceeds --max-position-embeddings {}",
            st.seq.size * tp_.size() * S, table.dim(0));
  st.seq.runs(st.s0, S, S * tp_.size(), [&](int64_t r, int64_t p, int64_t n) {
    if (h_SBH.device().is_cuda()) {
      Tensor rows = h_SBH.slice(r - st.s0, n);
      return kernels::cuda::position_add_rows(rows, table.slice(p, n));
    }
    MOE_DISPATCH_FLOAT(table.dtype(), T,
                       { add_rows<T>(h_SBH.data<T>() + (r - st.s0) * B * H, table.data<T>() + p * H, n, B, H); });
  });
}

void PositionEmbedding::backward(const Tensor& dh_SBH, Stash& st) {
  Tensor& grad = weight_->grad_to_add();
  const int64_t S = dh_SBH.dim(0), B = dh_SBH.dim(1), H = grad.dim(1);
  MOE_ASSERT(dh_SBH.ndim() == 3 && dh_SBH.dim(2) == H && st.seq.size * (st.s0 + S) <= grad.dim(0));
  st.seq.runs(st.s0, S, S * tp_.size(), [&](int64_t r, int64_t p, int64_t n) {
    if (dh_SBH.device().is_cuda()) {
      Tensor g = grad.slice(p, n);
      return kernels::cuda::position_sum_rows(dh_SBH.slice(r - st.s0, n), g);
    }
    MOE_DISPATCH_FLOAT(grad.dtype(), T,
                       { sum_rows<T>(dh_SBH.data<T>() + (r - st.s0) * B * H, grad.data<T>() + p * H, n, B, H); });
  });
}

}  // namespace moecore::nn
