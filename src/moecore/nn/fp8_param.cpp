// FP8 primary weights (see fp8_param.h).
#include "moecore/nn/fp8_param.h"

#include <cmath>

#include "moecore/core/error.h"
#include "moecore/nn/parameter.h"

namespace moecore::nn {

namespace {
constexpr int64_t kWeightBlock = 128;  // blockwise weights: 128 × 128 blocks, as Fp8Gemm::quantize casts them
}

Fp8Param::Fp8Param(std::vector<std::shared_ptr<Fp8Gemm>> sites, int64_t rows, int64_t cols)
    : sites_(std::move(sites)), rows_(rows), cols_(cols), format_(sites_.front()->format(Fp8Operand::Weight)) {
  MOE_ASSERT(!sites_.empty() && rows > 0 && cols > 0);
  if (recipe() == Fp8Recipe::Blockwise) {
    block_cols_ = (cols + kWeightBlock - 1) / kWeightBlock;
    blocks_per_slice_ = (rows + kWeightBlock - 1) / kWeightBlock * block_cols_;
  }
  scales_.assign(static_cast<size_t>(amax_slots()), 1.0f);
  inv_.assign(scales_.size(), 1.0f);
}

int64_t Fp8Param::slot_of(int64_t i) const {
  const int64_t rc = rows_ * cols_, slice = i / rc;
  if (blocks_per_slice_ == 1) return slice;
  const int64_t k = i - slice * rc;
  return slice * blocks_per_slice_ + (k / cols_) / kWeightBlock * block_cols_ + (k % cols_) / kWeightBlock;
}

void Fp8Param::add_amax(const float* v, int64_t first, int64_t n, double* amax) const {
  MOE_ASSERT(first >= 0 && first + n <= numel());
  for (int64_t j = 0; j < n; j++) {
    const double a = std::fabs(static_cast<double>(v[j]));
    MOE_CHECK(std::isfinite(a),
              "FP8 weight {}: its fp32 master holds a {} value, so it has no FP8 scale; the run has diverged: lower "
              "--lr, clip gradients (--clip-grad) or resume from an earlier checkpoint",
              sites_[static_cast<size_t>((first + j) / (rows_ * cols_))]->name(), std::isnan(a) ? "NaN" : "infinite");
    double& m = amax[slot_of(first + j)];
    m = std::max(m, a);
  }
}

void Fp8Param::set_scales(std::vector<double> amax) {
  MOE_ASSERT(static_cast<int64_t>(amax.size()) == amax_slots());
  for (size_t s = 0; s < amax.size(); s++) {
    if (recipe() == Fp8Recipe::Blockwise) {  // each block's own (a tensor-parallel shard's blocks are whole blocks)
      scales_[s] = kernels::fp8_scale_from_amax(amax[s], format_, /*pow2=*/true);
    } else {
      Fp8Gemm& site = *sites_[s];
      if (site.tp().on()) {  // the whole tensor's amax, as the non-gathered cast reduces it (Fp8Gemm::quantize)
        Tensor buf = Tensor::empty({1}, DType::F64);
        buf.data<double>()[0] = amax[s];
        site.tp().group->all_reduce(buf, comm::ReduceOp::Max);
        amax[s] = buf.data<double>()[0];
      }
      scales_[s] = site.recipe() == Fp8Recipe::Tensorwise ? kernels::fp8_scale_from_amax(amax[s], format_, false)
                                                          : site.take_delayed_scale(Fp8Operand::Weight, amax[s]);
    }
    inv_[s] = 1.0f / scales_[s];
  }
}

void Fp8Param::encode(const float* v, int64_t first, int64_t n, uint8_t* codes) const {
  MOE_ASSERT(first >= 0 && first + n <= numel());
  for (int64_t j = 0; j < n; j++) {
    const float scale = scales_[static_cast<size_t>(slot_of(first + j))];
    codes[j] = kernels::fp8_encode(kernels::fp8_round(v[j] * scale, format_), format_);
  }
}

void Fp8Param::decode(const uint8_t* codes, int64_t first, int64_t n, float* out) const {
  MOE_ASSERT(first >= 0 && first + n <= numel());
  for (int64_t j = 0; j < n; j++)
    out[j] =
        kernels::fp8_dequantize(kernels::fp8_decode(codes[j], format_), inv_[static_cast<size_t>(slot_of(first + j))]);
}

void make_fp8_param(Parameter& p, const std::vector<std::shared_ptr<Fp8Gemm>>& sites, int64_t rows, int64_t cols) {
  if (sites.empty() || !sites.front()->weight_is_fp8_param()) return;
  MOE_ASSERT(static_cast<int64_t>(sites.size()) * rows * cols == p.value.numel());
  p.fp8 = std::make_shared<Fp8Param>(sites, rows, cols);
  p.low_storage = std::nullopt;  // its FP8 values are held in f32, read as they are
}

void fp8_cast_whole(Parameter& p, const Tensor& master) {
  MOE_ASSERT(p.fp8 && master.dtype() == DType::F32 && master.numel() == p.value.numel());
  const Tensor m = master.to(Device::cpu());
  const int64_t n = m.numel();
  std::vector<double> amax(static_cast<size_t>(p.fp8->amax_slots()), 0.0);
  p.fp8->add_amax(m.data<float>(), 0, n, amax.data());
  p.fp8->set_scales(std::move(amax));
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  p.fp8->encode(m.data<float>(), 0, n, codes.data());
  Tensor out = Tensor::empty(m.shape(), DType::F32);
  p.fp8->decode(codes.data(), 0, n, out.data<float>());
  p.value.copy_from(out);
}

}  // namespace moecore::nn
