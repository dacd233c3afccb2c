// The native-bf16 flash attention kernel's bf16 tensors and its own RoPE (attention_flash_native.cpp, attention.h
// AttentionRope), on AVX512-BF16 where the CPU has it and on the emulated AMX path everywhere:
// - bf16 q, k, v, dout give the f32 call's outputs rounded once, bit for bit (inputs that are bf16 values already,
//   and the f32 backward given the rounded o, which is what the bf16 call keeps);
// - RoPE inside the kernel gives exactly rope_forward on q and k, the kernel, and rope_backward on dq and dk — for the
//   whole head and for half of it (--rotary-percent 0.5), into f32 and into bf16 outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/attention_flash_native.h"
#include "moecore/kernels/rope.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::flash::NativeBf16;

struct IoDims {
  int64_t S, B, Nq, Nkv, D;
  std::string str() const {
    return "S=" + std::to_string(S) + " B=" + std::to_string(B) + " heads=" + std::to_string(Nq) + "/" +
           std::to_string(Nkv) + " D=" + std::to_string(D);
  }
};

// Random bf16 values held in f32 tensors (the values a bf16 tensor holds exactly).
Tensor bf16_valued(const Shape& s, uint64_t seed) {
  return testing::randn(s, DType::F32, seed).to(DType::BF16).to(DType::F32);
}

struct IoRun {
  Tensor q, k, v, g;  // inputs (f32 tensors of bf16 values)
  Tensor o, lse;      // forward
  Tensor dq, dk, dv;  // backward
  explicit IoRun(const IoDims& c)
      : q(bf16_valued({c.S, c.B, c.Nq, c.D}, 31)),
        k(bf16_valued({c.S, c.B, c.Nkv, c.D}, 32)),
        v(bf16_valued({c.S, c.B, c.Nkv, c.D}, 33)),
        g(bf16_valued({c.S, c.B, c.Nq, c.D}, 34)) {}
};

std::vector<NativeBf16> io_backends() {
  std::vector<NativeBf16> out = {NativeBf16::AmxEmulated};
  if (kernels::flash::native_bf16_supported(NativeBf16::Avx512Bf16)) out.push_back(NativeBf16::Avx512Bf16);
  if (kernels::flash::native_bf16_supported(NativeBf16::Amx)) out.push_back(NativeBf16::Amx);
  return out;
}

// Forward and backward on the inputs converted to `in`, outputs of dtype `out`; backward gets `o_for_bwd` (or the
// forward's o) and the given RoPE.
void io_call(IoRun& r, NativeBf16 b, DType in, DType out, const kernels::AttentionRope* rope, const Tensor* q_in,
             const Tensor* k_in, const Tensor* o_for_bwd = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(r.q.dim(3)));
  const Tensor q = (q_in ? *q_in : r.q).to(in), k = (k_in ? *k_in : r.k).to(in), v = r.v.to(in), g = r.g.to(in);
  r.o = Tensor::empty(q.shape(), out);
  r.lse = Tensor::empty({q.dim(1), q.dim(2), q.dim(0)}, DType::F32);
  kernels::flash::forward_native(q, k, v, scale, r.o, r.lse, nullptr, b, rope);
  r.dq = Tensor::empty(q.shape(), out);
  r.dk = Tensor::empty(k.shape(), out);
  r.dv = Tensor::empty(v.shape(), out);
  const Tensor o = o_for_bwd ? o_for_bwd->to(in) : r.o;
  kernels::flash::backward_native(g, q, k, v, o, r.lse, scale, r.dq, r.dk, r.dv, nullptr, b, rope);
}

void expect_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_TRUE(testing::bitwise_equal(got, want))
      << what << ": relative difference " << testing::max_rel_diff(got, want);
}

const std::vector<IoDims> kIoShapes = {{130, 2, 4, 2, 64}, {70, 1, 2, 1, 80}, {17, 2, 2, 2, 128}};

TEST(FlashNativeBf16Io, Bf16TensorsGiveTheF32ResultsRoundedOnce) {
  for (NativeBf16 b : io_backends())
    for (const IoDims& c : kIoShapes) {
      const std::string what = std::string(kernels::flash::native_bf16_name(b)) + " " + c.str();
      IoRun f32(c), bf(c);
      io_call(bf, b, DType::BF16, DType::BF16, nullptr, nullptr, nullptr);
      const Tensor o_rounded = bf.o.to(DType::F32);  // what the bf16 call's backward reads
      io_call(f32, b, DType::F32, DType::F32, nullptr, nullptr, nullptr, &o_rounded);
      expect_bits(bf.o, f32.o.to(DType::BF16), what + " o");
      expect_bits(bf.lse, f32.lse, what + " lse");
      expect_bits(bf.dq, f32.dq.to(DType::BF16), what + " dq");
      expect_bits(bf.dk, f32.dk.to(DType::BF16), what + " dk");
      expect_bits(bf.dv, f32.dv.to(DType::BF16), what + " dv");
    }
}

TEST(FlashNativeBf16Io, RopeInsideTheKernelIsRopeOutsideIt) {
  for (NativeBf16 b : io_backends())
    for (const IoDims& c : kIoShapes)
      for (int64_t rot : {c.D, c.D / 2 / 2 * 2})
        for (DType out : {DType::F32, DType::BF16}) {
          const std::string what = std::string(kernels::flash::native_bf16_name(b)) + " " + c.str() +
                                   " rot_dim=" + std::to_string(rot) + " out " + std::string(dtype_name(out));
          Tensor cos, sin;
          kernels::rope_tables(c.S + 5, rot, 10000.0, DType::F32, cos, sin);
          // Outside: rotated q and k into the kernel, its dq and dk turned back after.
          IoRun outside(c);
          Tensor qr = Tensor::empty(outside.q.shape(), DType::F32), kr = Tensor::empty(outside.k.shape(), DType::F32);
          kernels::rope_forward(outside.q, cos, sin, rot, qr);
          kernels::rope_forward(outside.k, cos, sin, rot, kr);
          io_call(outside, b, DType::F32, DType::F32, nullptr, &qr, &kr);
          kernels::rope_backward(outside.dq, cos, sin, rot, outside.dq);
          kernels::rope_backward(outside.dk, cos, sin, rot, outside.dk);
          // Inside: unrotated q and k, the kernel turns them.
          IoRun inside(c);
          const kernels::AttentionRope rope{&cos, &sin, rot};
          io_call(inside, b, DType::F32, out, &rope, nullptr, nullptr, out == DType::BF16 ? &outside.o : nullptr);
          expect_bits(inside.o, outside.o.to(out), what + " o");
          expect_bits(inside.lse, outside.lse, what + " lse");
          expect_bits(inside.dq, outside.dq.to(out), what + " dq");
          expect_bits(inside.dk, outside.dk.to(out), what + " dk");
          expect_bits(inside.dv, outside.dv.to(out), what + " dv");
        }
}

}  // namespace
}  // namespace moecore
