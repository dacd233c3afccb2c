// The two-stage column reductions on the GPU (kernels/cuda/col_reduce.cu): RMSNorm's dw, LayerNorm's dw/db and the
// bias gradient against the CPU kernels run in f64 (within 1e-5 of the reference's magnitude) and in f32 (their
// row-by-row f32 sum is itself ~1e-5 off at 131,072 rows, hence 5e-5), bitwise reruns, and a micro-benchmark that
// prints each reduction's time and GB/s next to the one-thread-per-column walk it replaced.
#include <gtest/gtest.h>

// CUDA builds only (the launchers and streams need CUDA's headers).
#ifdef MOECORE_HAVE_CUDA
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/device/check.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/embedding.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/rmsnorm.h"

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

constexpr double kVsF64 = 1e-5;
constexpr double kVsF32 = 5e-5;

struct Shape2 {
  int64_t rows, H;
};
// The qk-layernorm of the Qwen3-MoE benchmark (32 heads × 4096 tokens, 128 wide), a few rows of a wide layer, one
// row, a ragged shape, and a hidden-size norm.
const std::vector<Shape2> kShapes = {{131072, 128}, {3, 5000}, {1, 7}, {1000, 33}, {4096, 2048}};

Tensor positive(const Shape& s, uint64_t seed) {  // rstd-like values in [0.5, 1.5]
  Tensor t = host_random(s, seed, 0.5);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, t.item(i) + 1.0);
  return t;
}

TEST(CudaReductions, RmsNormWeightGradientMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  for (const auto [rows, H] : kShapes) {
    const Tensor dy = host_random({rows, H}, 1), x = host_random({rows, H}, 2), w = host_random({H}, 3);
    const Tensor rstd = positive({rows}, 4), dw0 = host_random({H}, 5);
    Tensor dx64 = Tensor::empty({rows, H}, DType::F64), dw64 = dw0.to(DType::F64);
    rmsnorm_backward(dy.to(DType::F64), x.to(DType::F64), w.to(DType::F64), rstd.to(DType::F64), dx64, dw64);
    Tensor dx32 = Tensor::empty({rows, H}, DType::F32), dw32 = dw0.clone();
    rmsnorm_backward(dy, x, w, rstd, dx32, dw32);
    auto run = [&] {
      Tensor dx = Tensor::empty({rows, H}, DType::F32, Device::cuda()), dw = gpu(dw0);
      rmsnorm_backward(gpu(dy), gpu(x), gpu(w), gpu(rstd), dx, dw);
      return std::pair{dx, dw};
    };
    const auto [dx, dw] = run();
    EXPECT_LT(rel_diff(dw, dw64), kVsF64) << rows << "x" << H;
    EXPECT_LT(rel_diff(dw, dw32), kVsF32) << rows << "x" << H;
    EXPECT_LT(rel_diff(dx, dx64), kVsF64) << rows << "x" << H;
    EXPECT_TRUE(bitwise_equal(dw, run().second)) << rows << "x" << H;
  }
}

TEST(CudaReductions, LayerNormWeightAndBiasGradientsMatchTheCpu) {
  MOE_REQUIRE_GPU();
  for (const auto [rows, H] : kShapes) {
    const Tensor dy = host_random({rows, H}, 11), x = host_random({rows, H}, 12), w = host_random({H}, 13);
    const Tensor mean = host_random({rows}, 14, 0.5), rstd = positive({rows}, 15);
    const Tensor dw0 = host_random({H}, 16), db0 = host_random({H}, 17);
    const auto f64 = [](const Tensor& t) { return t.to(DType::F64); };
    Tensor dx64 = Tensor::empty({rows, H}, DType::F64), dw64 = f64(dw0), db64 = f64(db0);
    layernorm_backward(f64(dy), f64(x), f64(w), f64(mean), f64(rstd), dx64, dw64, db64);
    Tensor dx32 = Tensor::empty({rows, H}, DType::F32), dw32 = dw0.clone(), db32 = db0.clone();
    layernorm_backward(dy, x, w, mean, rstd, dx32, dw32, db32);
    auto run = [&] {
      Tensor dx = Tensor::empty({rows, H}, DType::F32, Device::cuda()), dw = gpu(dw0), db = gpu(db0);
      layernorm_backward(gpu(dy), gpu(x), gpu(w), gpu(mean), gpu(rstd), dx, dw, db);
      return std::tuple{dx, dw, db};
    };
    const auto [dx, dw, db] = run();
    EXPECT_LT(rel_diff(dw, dw64), kVsF64) << rows << "x" << H;
    EXPECT_LT(rel_diff(db, db64), kVsF64) << rows << "x" << H;
    EXPECT_LT(rel_diff(dw, dw32), kVsF32) << rows << "x" << H;
    EXPECT_LT(rel_diff(db, db32), kVsF32) << rows << "x" << H;
    EXPECT_LT(rel_diff(dx, dx64), kVsF64) << rows << "x" << H;
    const auto [dx2, dw2, db2] = run();
    EXPECT_TRUE(bitwise_equal(dw, dw2) && bitwise_equal(db, db2)) << rows << "x" << H;
  }
}

TEST(CudaReductions, BiasGradientMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  for (const auto [rows, N] : kShapes) {
    const Tensor dy = host_random({rows, N}, 21), db0 = host_random({N}, 22);
    Tensor db64 = db0.to(DType::F64), db32 = db0.clone();
    accumulate_col_sums(dy.to(DType::F64), db64);
    accumulate_col_sums(dy, db32);
    auto run = [&] {
      Tensor db = gpu(db0);
      accumulate_col_sums(gpu(dy), db);
      return db;
    };
    const Tensor db = run();
    EXPECT_LT(rel_diff(db, db64), kVsF64) << rows << "x" << N;
    EXPECT_LT(rel_diff(db, db32), kVsF32) << rows << "x" << N;
    EXPECT_TRUE(bitwise_equal(db, run())) << rows << "x" << N;
  }
}

// Milliseconds per call of `fn` on the current stream: the median of 5 timed runs of 10 calls after a warm-up.
template <typename Fn>
double time_ms(Fn fn) {
  moecore::device::Event a(true), b(true);
  std::vector<double> ms;
  fn();
  for (int r = 0; r < 5; r++) {
    a.record(moecore::device::current_stream());
    for (int i = 0; i < 10; i++) fn();
    b.record(moecore::device::current_stream());
    b.synchronize();
    ms.push_back(b.ms_since(a) / 10.0);
  }
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

// The embedding's weight gradient sorts the tokens by row and adds each row's tokens in order: the CPU's bits, with a
// vocabulary shard, out-of-shard tokens, heavy repeats, and at the benchmark's size (4096 tokens, H 2048, 32k vocab).
TEST(CudaReductions, EmbeddingWeightGradientHasTheCpusBits) {
  MOE_REQUIRE_GPU();
  struct Case {
    int64_t T, H, V, shard_start, shard_rows;
  };
  for (const Case c : {Case{7, 33, 10, 0, 10}, Case{1000, 130, 50, 0, 50}, Case{1000, 130, 50, 20, 16},
                       Case{4096, 2048, 32768, 0, 32768}, Case{1, 5, 3, 0, 3}}) {
    Tensor ids = Tensor::empty({c.T}, DType::I64), ids32 = Tensor::empty({c.T}, DType::I32);
    uint64_t x = 12345;
    for (int64_t t = 0; t < c.T; t++) {  // a few very frequent ids and a long tail
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int64_t id =
          (x >> 33) % 4 == 0 ? static_cast<int64_t>((x >> 20) % 3) : static_cast<int64_t>((x >> 13) % c.V);
      ids.set_item(t, static_cast<double>(id));
      ids32.set_item(t, static_cast<double>(id));
    }
    const Tensor dy = host_random({c.T, c.H}, 41), dw0 = host_random({c.shard_rows, c.H}, 42);
    Tensor want = dw0.clone();
    embedding_backward(dy, ids, want, c.shard_start);
    for (const Tensor* id : {&ids, &ids32}) {
      Tensor got = gpu(dw0);
      embedding_backward(gpu(dy), gpu(*id), got, c.shard_start);
      EXPECT_TRUE(bitwise_equal(got, gpu(want))) << c.T << " tokens, H " << c.H << ", rows " << c.shard_start << "+"
                                                 << c.shard_rows << ", " << dtype_name(id->dtype());
    }
    if (c.T == 4096) {  // the benchmark's shape: its time and the bytes it moves (dy read, dW rows read and written)
      const Tensor gdy = gpu(dy), gids = gpu(ids);
      Tensor gdw = gpu(dw0);
      const double ms = time_ms([&] { embedding_backward(gdy, gids, gdw, c.shard_start); });
      std::printf("reduction rows=%lld H=%lld %-44s %9.4f ms %8.1f GB/s\n", static_cast<long long>(c.T),
                  static_cast<long long>(c.H), "embedding dW, sorted runs", ms,
                  12.0 * static_cast<double>(c.T * c.H) / (ms * 1e-3) / 1e9);
    }
  }
}

TEST(CudaReductions, MicroBenchmarkPrintsTimesAndBandwidth) {
  MOE_REQUIRE_GPU();
  for (const auto [rows, H] : {Shape2{131072, 128}, Shape2{4096, 2048}, Shape2{16384, 2048}}) {
    const Tensor dy = gpu(host_random({rows, H}, 31)), x = gpu(host_random({rows, H}, 32));
    const Tensor mean = gpu(host_random({rows}, 33)), rstd = gpu(positive({rows}, 34));
    Tensor dw = gpu(host_random({H}, 35)), db = gpu(host_random({H}, 36));
    Tensor scratch = Tensor::empty({launch::col_reduce_scratch_floats(rows, H, 2)}, DType::F32, Device::cuda());
    const cudaStream_t s = moecore::device::current_stream();
    float* sp = scratch.device_data<float>();
    const float *pdy = dy.device_data<float>(), *px = x.device_data<float>();
    const float *pm = mean.device_data<float>(), *pr = rstd.device_data<float>();
    float *pw = dw.device_data<float>(), *pb = db.device_data<float>();
    const double elems = static_cast<double>(rows) * static_cast<double>(H);
    struct Row {
      const char* name;
      double ms, bytes;
    };
    const std::vector<Row> rows_out = {
        {"bias grad, one thread per column (before)",
         time_ms([&] { launch::col_sums_sequential(pdy, pb, rows, H, s); }), 4 * elems},
        {"bias grad, two-stage", time_ms([&] { launch::col_sums_two_stage(pdy, pb, sp, rows, H, s); }), 4 * elems},
        {"RMSNorm dw, two-stage", time_ms([&] { launch::rmsnorm_dw_two_stage(pdy, px, pr, pw, sp, rows, H, s); }),
         8 * elems + 4.0 * rows},
        {"LayerNorm dw+db, two-stage",
         time_ms([&] { launch::layernorm_dwb_two_stage(pdy, px, pm, pr, pw, pb, sp, rows, H, s); }),
         8 * elems + 8.0 * rows},
    };
    MOE_CUDA_CHECK(cudaGetLastError());
    for (const Row& r : rows_out)
      std::printf("reduction rows=%lld H=%lld %-44s %9.4f ms %8.1f GB/s\n", static_cast<long long>(rows),
                  static_cast<long long>(H), r.name, r.ms, r.bytes / (r.ms * 1e-3) / 1e9);
    // The point of the change: at 131,072 × 128 the walk down the rows is far slower than the two stages.
    if (H == 128) {
      EXPECT_LT(rows_out[1].ms, rows_out[0].ms);
    }
  }
}

}  // namespace
}  // namespace moecore::kernels

#endif  // MOECORE_HAVE_CUDA
