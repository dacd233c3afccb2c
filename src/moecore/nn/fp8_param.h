// FP8 primary weights (Megatron's --fp8-param-gather): the weight of an FP8 GEMM site held as its FP8 value, the
// fp32 master (kept by the optimizer) cast after each step with the scale its recipe takes for the whole tensor,
// and moved between ranks as FP8 bytes (one per element) plus the scales every rank knows. The parameter's `value`
// holds the bytes read back in f32 (code·scale_inv, as the FP8 GEMM reads them), so the GEMMs take it as it is.
// This is the cast and the byte encoding; which ranks own which elements and the collectives are the optimizers'
// (optim/distributed_optimizer_fp8.cpp, optim/adamw.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moecore/nn/fp8_recipe.h"

namespace moecore::nn {

struct Parameter;

class Fp8Param {
 public:
  // One site per slice of the parameter: its elements are `sites.size()` row-major [rows, cols] matrices laid end to
  // end (a Linear's weight is one; grouped experts' weights one per local expert, each with its own scales).
  Fp8Param(std::vector<std::shared_ptr<Fp8Gemm>> sites, int64_t rows, int64_t cols);
  int64_t numel() const { return static_cast<int64_t>(sites_.size()) * rows_ * cols_; }
  Fp8Recipe recipe() const { return sites_.front()->recipe(); }
  // The cast's amaxes: one per slice (tensorwise, delayed) or per 128 × 128 block of a slice (blockwise).
  int64_t amax_slots() const { return static_cast<int64_t>(sites_.size()) * blocks_per_slice_; }
  // Raises amax[slot] to max |v| over the parameter's elements [first, first + n) (flat, this rank's local tensor),
  // whose values are v[0..n). A non-finite value is an error naming the parameter: the run has diverged.
  void add_amax(const float* v, int64_t first, int64_t n, double* amax) const;
  // From the amaxes of the whole tensor (each rank's partial amaxes reduced, max, over the ranks that split it),
  // the scales: tensorwise fp8 max / amax, reduced over the site's tensor-parallel group first as TE reduces a
  // weight's amax; delayed the site's current weight scale, the amax joining its history; blockwise a power of two
  // per block. Collective over the tensor-parallel group for the per-tensor recipes.
  void set_scales(std::vector<double> amax);
  // The FP8 bytes of elements [first, first + n) from values v (round(v·scale) in the format), and the values they
  // stand for (code · (1/scale), in f32), for the elements [first, first + n).
  void encode(const float* v, int64_t first, int64_t n, uint8_t* codes) const;
  void decode(const uint8_t* codes, int64_t first, int64_t n, float* out) const;
  // Each slot's scale (set_scales), for tests.
  const std::vector<float>& scales() const { return scales_; }

 private:
  int64_t slot_of(int64_t i) const;
  std::vector<std::shared_ptr<Fp8Gemm>> sites_;
  int64_t rows_, cols_, blocks_per_slice_ = 1, block_cols_ = 1;
  kernels::Fp8Format format_;
  std::vector<float> scales_, inv_;
};

// Attaches an FP8 parameter to `p` where the model runs under --fp8-param-gather and `sites` exist (one per slice
// of [rows, cols]): `p` is then stored in f32 (its FP8 values), never in bf16.
void make_fp8_param(Parameter& p, const std::vector<std::shared_ptr<Fp8Gemm>>& sites, int64_t rows, int64_t cols);

// The plain optimizer's cast, on a rank holding the whole local tensor: p.value = the FP8 cast of `master` (its
// amaxes over the whole local tensor, reduced over tensor parallelism as the recipe says).
void fp8_cast_whole(Parameter& p, const Tensor& master);

}  // namespace moecore::nn
