// Muon's orthogonalisation (emerging_optimizers' newton_schulz, which Megatron's Muon calls): the matrix is
// transposed when it has more rows than columns, normalised by its Frobenius norm (max(‖G‖, 1e-7)), then
// `steps` quintic Newton–Schulz iterations X ← a·X + (b·A + c·A·A)·X with A = X·Xᵀ, one (a, b, c) per step from
// the coefficient set, give U·S'·Vᵀ with S' ≈ 1. With `bf16` (Megatron's default --muon-fp32-matmul-prec medium)
// X, A and B are rounded to bf16 after each product (bf16 inputs, fp32 accumulation), as torch does there.
// And the update scale that follows it (get_muon_scale_factor).
#pragma once

#include <string>

#include "moecore/core/tensor.h"

namespace moecore::optim {

// Refuses (with the flag names) a coefficient type moecore does not know or a step count it does not allow:
// simple repeats its one set; quintic (5 sets) and aol (4) need a multiple of their count; polar_express (8)
// needs at least 8, repeating its last set.
void check_newton_schulz(const std::string& coefficient_type, int64_t steps);

// G: a 2-D f32 matrix [m, n]. Returns the orthogonalised f32 matrix of the same shape.
Tensor newton_schulz(const Tensor& G, int64_t steps, const std::string& coefficient_type, bool bf16);

// spectral: sqrt(max(m, n)); unit_rms_norm: sqrt(m / n); shape_scaling: sqrt(max(1, m / n)). m = rows (out).
double muon_scale_factor(int64_t rows, int64_t cols, const std::string& mode);

}  // namespace moecore::optim
