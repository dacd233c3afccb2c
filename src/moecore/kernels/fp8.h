// FP8 quantization as TransformerEngine's recipes apply it to GEMM operands, emulated exactly: each value scaled,
// rounded to nearest even on the E4M3 or E5M2 grid with saturation to ±max, and read back as fp8·scale_inv in f32
// ("quantize-dequantize"), so that an f32 GEMM of the results computes what an FP8 GEMM with f32 accumulation does.
// Not the recipes' bookkeeping (scales from amax histories: nn/fp8_recipe.h). CPU only: the GPU refuses FP8 runs at
// configuration time (train/config/device_support.cpp).
#pragma once

#include <cstdint>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, largest finite 448, no infinities (OCP "fn" variant, as on
// Hopper). E5M2: 5 exponent bits (bias 15), 2 mantissa bits, largest finite 57344.
enum class Fp8Format { E4M3, E5M2 };
const char* fp8_format_name(Fp8Format f);
double fp8_max(Fp8Format f);

// v rounded to the nearest value of the format (ties to even mantissa, subnormals included), saturated to ±max
// (infinities included, as a saturating cast does); NaN stays NaN.
float fp8_round(float v, Fp8Format f);

// The byte of an FP8 value (sign, exponent, mantissa bits; v one of the format's finite values, as fp8_round returns
// them) and back: fp8_decode(fp8_encode(v, f), f) == v. FP8 tensors move and are stored as these bytes.
uint8_t fp8_encode(float v, Fp8Format f);
float fp8_decode(uint8_t code, Fp8Format f);

// max |x| over an f32 or bf16 tensor: NaN if any element is NaN, else +inf if any is infinite.
double fp8_amax(const Tensor& x);

// The scale that maps amax onto the format's largest value: max / amax, FLT_MAX where that overflows, 1 where amax
// is 0 (an all-zero tensor); with pow2 rounded down to a power of two (its inverse is then exact).
float fp8_scale_from_amax(double amax, Fp8Format f, bool pow2);

// An FP8 value read back in f32: fp8·inv (inv = 1/scale in f32), saturated to ±FLT_MAX.
float fp8_dequantize(float fp8, float inv);

// y = fp8_round(x·scale)·(1/scale), every product in f32. x f32 or bf16 [rows, cols]; y f32 of the same shape.
void fp8_quantize_tensorwise(const Tensor& x, Fp8Format f, float scale, Tensor& y);

// The same with one scale per block of block_rows × block_cols elements (the last blocks along each dimension may
// be partial), each block's scale fp8_scale_from_amax(its own amax, f, pow2): 1 × 128 tiles (a row's 128
// consecutive values), 128 × 1 (a column's) or 128 × 128 blocks. x must be finite.
void fp8_quantize_blockwise(const Tensor& x, Fp8Format f, int64_t block_rows, int64_t block_cols, bool pow2, Tensor& y);

}  // namespace moecore::kernels
