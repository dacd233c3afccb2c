// Host emulation (emu_cuda.h) of the kernels around the GPU grouped experts, for machines without a GPU: the kernels
// that read or write the expert GEMMs' bf16 outputs with no cast pass between: elementwise.cu's activations reading a
// bf16 fc1 output and a bf16 output gradient (bitwise the f32 kernels' results on the widened values, i.e. what the
// removed cast passes fed them), norm_bias.cu's bias add into bf16 rows, and moe_permute.cu's per-token row sums of
// bf16 rows into f32 (both kernels, bitwise against the CPU's order: widened, summed from 0 in row order). Built and
// run by run.sh (CTest cuda_grouped_host_emulation).
#include "emu_cuda.h"
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"
#include "moecore/kernels/cuda/launch_moe.h"

// The kernels, rewritten by cuda_kernels_emulate.py.
#include "grouped_emulate.inc"

using namespace moecore::launch;
namespace {
uint16_t bits16(__nv_bfloat16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> o(v.size());
  for (size_t i = 0; i < v.size(); i++) o[i] = __float2bfloat16_rn(v[i]);
  return o;
}
std::vector<float> widen(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); i++) o[i] = __bfloat162float(v[i]);
  return o;
}
bool report(const char* what, bool ok) {
  std::printf("%-72s %s\n", what, ok ? "ok" : "FAIL");
  return ok;
}

// The activation reading bf16 x (and, backward, bf16 dy) directly gives the bits the f32 kernel gives on the widened
// values: forward output (f32 and bf16), backward dx (bf16) and dprobs.
bool activation_case(int act, int64_t rows, int64_t F) {
  const int64_t F1 = act == 0 ? 2 * F : F;
  const auto x16 = to_bf16(emu::rnd(rows * F1, 3, -3, 3)), dy16 = to_bf16(emu::rnd(rows * F, 4));
  const auto x32 = widen(x16), dy32 = widen(dy16);
  const auto probs = emu::rnd(rows, 5, 0, 1);
  std::vector<float> y_a(rows * F), y_b(rows * F);
  std::vector<__nv_bfloat16> y16_a(rows * F), y16_b(rows * F);
  activation_forward(act, x16.data(), true, probs.data(), y_a.data(), false, rows, F, nullptr);
  activation_forward(act, x32.data(), false, probs.data(), y_b.data(), false, rows, F, nullptr);
  activation_forward(act, x16.data(), true, probs.data(), y16_a.data(), true, rows, F, nullptr);
  activation_forward(act, x32.data(), false, probs.data(), y16_b.data(), true, rows, F, nullptr);
  bool ok = std::memcmp(y_a.data(), y_b.data(), y_a.size() * 4) == 0;
  for (size_t i = 0; i < y16_a.size(); i++) ok &= bits16(y16_a[i]) == bits16(y16_b[i]);
  std::vector<__nv_bfloat16> dx_a(rows * F1), dx_b(rows * F1);
  std::vector<float> dp_a(rows, NAN), dp_b(rows, NAN);
  activation_backward(act, dy16.data(), true, x16.data(), true, probs.data(), dx_a.data(), true, dp_a.data(), rows, F,
                      nullptr);
  activation_backward(act, dy32.data(), false, x32.data(), false, probs.data(), dx_b.data(), true, dp_b.data(), rows, F,
                      nullptr);
  for (size_t i = 0; i < dx_a.size(); i++) ok &= bits16(dx_a[i]) == bits16(dx_b[i]);
  ok &= std::memcmp(dp_a.data(), dp_b.data(), dp_a.size() * 4) == 0;
  // And the f32 path against an f64 reference of the SwiGLU forward (the shared math is right, not only alike).
  if (act == 0) {
    double err = 0;
    for (int64_t t = 0; t < rows; t++)
      for (int64_t j = 0; j < F; j++) {
        const double a = x32[t * F1 + j], b = x32[t * F1 + F + j];
        const double want = a / (1 + std::exp(-a)) * b * probs[t];
        err = std::max(err, std::fabs(want - y_b[t * F + j]) / (std::fabs(want) + 1e-3));
      }
    ok &= err < 1e-5;
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "activation %d rows=%ld F=%ld: bf16 inputs = f32 on widened inputs", act, long(rows),
                long(F));
  return report(buf, ok);
}

// y = bf16(f32(y) + b·w) in place on bf16 rows (and, without w, + b), as the CPU's bias_rows.
bool bias_bf16_case(int64_t rows, int64_t N, bool weighted) {
  auto y = to_bf16(emu::rnd(rows * N, 6));
  const auto b = emu::rnd(N, 7), w = emu::rnd(rows, 8, 0, 1);
  std::vector<uint16_t> want(y.size());
  for (int64_t t = 0; t < rows; t++)
    for (int64_t j = 0; j < N; j++) {
      const float add = weighted ? b[j] * w[t] : b[j];
      want[t * N + j] = bits16(__float2bfloat16_rn(__bfloat162float(y[t * N + j]) + add));
    }
  add_row_bias(y.data(), true, b.data(), weighted ? w.data() : nullptr, rows, N, nullptr);
  bool ok = true;
  for (size_t i = 0; i < y.size(); i++) ok &= bits16(y[i]) == want[i];
  char buf[96];
  std::snprintf(buf, sizeof buf, "bias into bf16 rows %ldx%ld%s", long(rows), long(N), weighted ? ", weighted" : "");
  return report(buf, ok);
}

// dst[t] = Σ widened src rows of token t, in order from 0: the 8-wide and the scalar kernel, bitwise.
bool sum_rows_bf16_case(int64_t T, int64_t K, int64_t H) {
  std::mt19937 r(static_cast<unsigned>(T * 31 + H));
  std::vector<int64_t> off(static_cast<size_t>(T + 1), 0);
  std::vector<int32_t> rows;
  for (int64_t t = 0; t < T; t++) {
    const int64_t n = r() % (K + 1);  // tokens with 0..K rows (dropped rows, other ranks')
    for (int64_t i = 0; i < n; i++) rows.push_back(static_cast<int32_t>(r() % (T * K)));
    off[static_cast<size_t>(t + 1)] = static_cast<int64_t>(rows.size());
  }
  const auto src = to_bf16(emu::rnd(T * K * H, 9, -4, 4));
  std::vector<float> want(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H; h++) {
      float acc = 0.0f;
      for (int64_t i = off[t]; i < off[t + 1]; i++) acc += __bfloat162float(src[rows[i] * H + h]);
      want[t * H + h] = acc;
    }
  std::vector<float> got(want.size(), NAN);
  if (H % 8 == 0) {
    emu::launch(dim3(static_cast<unsigned>(T)), dim3(64), [&] {
      sum_rows_bf16x8_kernel(reinterpret_cast<const uint4*>(src.data()), off.data(), rows.data(),
                             reinterpret_cast<float4*>(got.data()), T, H / 8);
    });
  } else {
    emu::launch(dim3(static_cast<unsigned>(T)), dim3(64),
                [&] { sum_rows_bf16_kernel(src.data(), off.data(), rows.data(), got.data(), T, H); });
  }
  const bool ok = std::memcmp(got.data(), want.data(), want.size() * 4) == 0;
  char buf[96];
  std::snprintf(buf, sizeof buf, "row sums of bf16 rows into f32 T=%ld K<=%ld H=%ld (%s)", long(T), long(K), long(H),
                H % 8 == 0 ? "8 wide" : "scalar");
  return report(buf, ok);
}
}  // namespace

int main() {
  bool ok = true;
  for (int act : {0, 1, 2}) ok &= activation_case(act, 5, 40);
  ok &= activation_case(0, 3, 300);  // a row wider than the block
  ok &= bias_bf16_case(7, 33, true);
  ok &= bias_bf16_case(3, 64, false);
  ok &= sum_rows_bf16_case(13, 8, 64);
  ok &= sum_rows_bf16_case(9, 3, 37);
  std::printf(ok ? "all pass\n" : "FAILURES\n");
  return ok ? 0 : 1;
}
