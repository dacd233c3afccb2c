// Grouped expert GEMMs on the GPU (the op is kernels/grouped_gemm.h's, declared in kernels/cuda/kernels.h): one GEMM
// per expert over that expert's block of rows, every expert a different row count, experts with no rows skipped.
// Operands f32 (TF32 off unless set_allow_tf32) or bf16 with f32 accumulation; outputs f32, or bf16 rounded by the
// GEMM's epilogue (the CPU grouped experts' semantics under --bf16); weight gradients accumulate into f32. No bias
// epilogue: the experts' biases are added per expert segment of rows afterwards (kernels::segment_bias_forward).
// Row-major products are computed as their column-major transposes, as in gemm_cublaslt.cpp: C_e[r, N] =
// A_e[r, K]·op(W_e) is Cᵀ = op(W_e)ᵀ·A_eᵀ with m = N, n = r, k = K, and the weight gradient dW_e[N, K] += dY_eᵀ·X_e is
// dWᵀ = X_eᵀ·dY_e with m = K, n = N, k = r. Each expert with rows is one problem (the problem list is built on the
// host from the row counts, already there: the dispatch copied them), run as one cuBLASLt matmul, the experts dealt
// round-robin over kStreams streams that wait for the caller's stream and are waited on by it (events); each stream
// has its own workspace. Deterministic: no atomics or split-K reductions are requested, and each output has one
// writer.
#include <cublasLt.h>

#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

// Named, not anonymous: the unity build puts this file beside gemm_cublaslt.cpp, whose anonymous names (Ctx, Plan)
// would collide.
namespace grouped_detail {
constexpr int kStreams = 4;
constexpr size_t kLtWorkspace = size_t(32) << 20;

struct Problem {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void* A;
  int lda;
  const void* B;
  int ldb;
  void* C;
  int ldc;
};

struct LtKey {
  int device;
  int m, n, k, lda, ldb, ldc;
  cublasOperation_t ta, tb;
  cudaDataType_t type, out;  // operands', output's
  bool tf32;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(device, m, n, k, lda, ldb, ldc, ta, tb, type, out, tf32, align_a, align_b, align_c);
  }
  bool operator<(const LtKey& o) const { return tie() < o.tie(); }
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct DeviceCtx {
  cublasLtHandle_t lt = nullptr;
  cudaStream_t streams[kStreams] = {};
  cudaEvent_t done[kStreams] = {};
  cudaEvent_t start = nullptr;
  void* workspace[kStreams] = {};
};

struct LtLayouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
};

struct Ctx {
  std::mutex mu;
  std::map<int, DeviceCtx> devices;
  // Algorithms by shape bucket (the row counts that change every step rounded up to a power of two: the heuristic
  // runs once per bucket, not once per row count), exact-shape ones where a bucket's does not apply, and the exact
  // shapes' layouts (cheap to create, kept for reuse).
  std::map<LtKey, LtPlan> plans, exact_plans;
  std::map<LtKey, LtLayouts> layouts;
};
Ctx& ctx() {
  static Ctx* c = new Ctx();  // never destroyed: the driver may be gone at static destruction
  return *c;
}

DeviceCtx& device_ctx(int device) {  // under ctx().mu
  DeviceCtx& dc = ctx().devices[device];
  if (!dc.lt) {
    MOE_CUBLAS_CHECK(cublasLtCreate(&dc.lt));
    MOE_CUDA_CHECK(cudaEventCreateWithFlags(&dc.start, cudaEventDisableTiming));
    for (int i = 0; i < kStreams; i++) {
      MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&dc.streams[i], cudaStreamNonBlocking));
      MOE_CUDA_CHECK(cudaEventCreateWithFlags(&dc.done[i], cudaEventDisableTiming));
      MOE_CUDA_CHECK(cudaMalloc(&dc.workspace[i], kLtWorkspace));
    }
  }
  return dc;
}

uint32_t alignment(const void* p) {  // the largest power of two up to 256 dividing the address
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t b = 256;
  while (b > 1 && a % b != 0) b /= 2;
  return b;
}

int as_int(int64_t v, const char* what) {
  MOE_ASSERT_MSG(v >= 0 && v <= std::numeric_limits<int>::max(), "grouped GEMM {} {} exceeds cuBLAS's int", what, v);
  return static_cast<int>(v);
}

cublasComputeType_t compute_type(cudaDataType_t in) {
  return in == CUDA_R_32F && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// The plan of `key` from `cache`, made on first use (under ctx().mu; map nodes are stable).
LtPlan make_lt_plan(DeviceCtx& dc, const LtKey& key);
const LtPlan& lt_plan(std::map<LtKey, LtPlan>& cache, DeviceCtx& dc, const LtKey& key) {
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache.emplace(key, make_lt_plan(dc, key)).first->second;
}

LtPlan make_lt_plan(DeviceCtx& dc, const LtKey& key) {
  LtPlan p;
  MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute_type(key.type), CUDA_R_32F));
  MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &key.ta, sizeof key.ta));
  MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &key.tb, sizeof key.tb));
  const bool na = key.ta == CUBLAS_OP_N, nb = key.tb == CUBLAS_OP_N;
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, key.type, na ? key.m : key.k, na ? key.k : key.m, key.lda));
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, key.type, nb ? key.k : key.n, nb ? key.n : key.k, key.ldb));
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, key.out, key.m, key.n, key.ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kLtWorkspace,
                                                        sizeof kLtWorkspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attr, bytes] : aligns)
    MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(dc.lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MOE_CUBLAS_CHECK(st);
  MOE_ASSERT_MSG(found > 0, "cuBLASLt has no algorithm for the expert GEMM m={} n={} k={}", key.m, key.n, key.k);
  p.algo = result.algo;
  return p;
}

// The next power of two at or above n (at least 64): a bucket of row counts that share one algorithm.
int bucket(int n) {
  int b = 64;
  while (b < n && b < (1 << 30)) b *= 2;
  return b;
}

const LtLayouts& lt_layouts(const LtKey& key) {  // under ctx().mu
  auto it = ctx().layouts.find(key);
  if (it != ctx().layouts.end()) return it->second;
  LtLayouts l;
  const bool na = key.ta == CUBLAS_OP_N, nb = key.tb == CUBLAS_OP_N;
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.a, key.type, na ? key.m : key.k, na ? key.k : key.m, key.lda));
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.b, key.type, nb ? key.k : key.n, nb ? key.n : key.k, key.ldb));
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.c, key.out, key.m, key.n, key.ldc));
  return ctx().layouts.emplace(key, l).first->second;
}

void run_lt_streams(Device d, const std::vector<Problem>& ps, cudaDataType_t in, cudaDataType_t out, float alpha,
                    float beta) {
  const cudaStream_t s = moecore::device::current_stream();
  std::unique_lock<std::mutex> lock(ctx().mu);
  DeviceCtx& dc = device_ctx(d.index);
  std::vector<const LtPlan*> plans(ps.size());
  std::vector<const LtLayouts*> layouts(ps.size());
  std::vector<LtKey> exact(ps.size());
  for (size_t i = 0; i < ps.size(); i++) {
    const Problem& p = ps[i];
    exact[i] = LtKey{d.index, p.m, p.n, p.k,          p.lda,          p.ldb,          p.ldc,         p.ta,
                     p.tb,    in,  out, allow_tf32(), alignment(p.A), alignment(p.B), alignment(p.C)};
    // The row counts are n in the forward and data-gradient products (C = op(W)·X per expert, column-major, X not
    // transposed) and k in the weight gradient (X transposed): only that dimension is bucketed, and the leading
    // dimensions grow with it where they must.
    LtKey b = exact[i];
    if (b.tb == CUBLAS_OP_T) {
      b.k = bucket(b.k);
      b.lda = std::max(b.lda, b.ta == CUBLAS_OP_N ? b.m : b.k);
    } else {
      b.n = bucket(b.n);
    }
    b.ldb = std::max(b.ldb, b.tb == CUBLAS_OP_N ? b.k : b.n);
    b.ldc = std::max(b.ldc, b.m);
    plans[i] = &lt_plan(ctx().plans, dc, b);
    layouts[i] = &lt_layouts(exact[i]);
  }
  lock.unlock();
  const int used = static_cast<int>(std::min<size_t>(ps.size(), kStreams));
  MOE_CUDA_CHECK(cudaEventRecord(dc.start, s));
  for (int i = 0; i < used; i++) MOE_CUDA_CHECK(cudaStreamWaitEvent(dc.streams[i], dc.start, 0));
  for (size_t i = 0; i < ps.size(); i++) {
    const Problem& p = ps[i];
    const LtPlan& pl = *plans[i];
    const int j = static_cast<int>(i % kStreams);
    const LtLayouts& l = *layouts[i];
    cublasStatus_t st = cublasLtMatmul(dc.lt, pl.desc, &alpha, p.A, l.a, p.B, l.b, &beta, p.C, l.c, p.C, l.c, &pl.algo,
                                       dc.workspace[j], kLtWorkspace, dc.streams[j]);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {  // the bucket's algorithm does not
      const LtPlan* e = nullptr;                                                   // fit this shape: its own one
      {
        const std::lock_guard<std::mutex> g(ctx().mu);
        e = &lt_plan(ctx().exact_plans, dc, exact[i]);
      }
      st = cublasLtMatmul(dc.lt, e->desc, &alpha, p.A, l.a, p.B, l.b, &beta, p.C, l.c, p.C, l.c, &e->algo,
                          dc.workspace[j], kLtWorkspace, dc.streams[j]);
    }
    MOE_CUBLAS_CHECK(st);
  }
  for (int i = 0; i < used; i++) {
    MOE_CUDA_CHECK(cudaEventRecord(dc.done[i], dc.streams[i]));
    MOE_CUDA_CHECK(cudaStreamWaitEvent(s, dc.done[i], 0));
  }
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

cudaDataType_t operand_type(const Tensor& a, const Tensor& b, const Tensor& c) {
  MOE_ASSERT_MSG(a.dtype() == b.dtype() && (a.dtype() == DType::F32 || a.dtype() == DType::BF16),
                 "grouped GEMM operands are f32 or bf16 of one dtype, got {} and {}", dtype_name(a.dtype()),
                 dtype_name(b.dtype()));
  MOE_ASSERT_MSG(c.dtype() == DType::F32 || (c.dtype() == DType::BF16 && a.dtype() == DType::BF16),
                 "grouped GEMM output must be f32, or bf16 with bf16 operands; got {} from {}", dtype_name(c.dtype()),
                 dtype_name(a.dtype()));
  MOE_ASSERT_MSG(a.device().is_cuda() && b.device() == a.device() && c.device() == a.device(),
                 "grouped GEMM operands on {}, {}, {}", a.device().str(), b.device().str(), c.device().str());
  return cuda_type(a.dtype());
}

void check_rows(const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows, int64_t E, int64_t R) {
  MOE_ASSERT_MSG(static_cast<int64_t>(rows.size()) == E && row_begin.size() == rows.size(),
                 "grouped GEMM over {} experts got {} row counts and {} offsets", E, rows.size(), row_begin.size());
  for (size_t e = 0; e < rows.size(); e++)
    MOE_ASSERT_MSG(rows[e] >= 0 && row_begin[e] >= 0 && row_begin[e] + rows[e] <= R,
                   "expert {}: rows [{}, {}) outside the {} rows", e, row_begin[e], row_begin[e] + rows[e], R);
}
}  // namespace grouped_detail

namespace gg = grouped_detail;

int64_t grouped_gemm_row_align() {
  return 1;  // cuBLASLt takes any row count
}

// The packed weights are the CPU backend's; cuBLASLt reads W as it is.
void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows, const ExpertWeightPacker*) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kGemm);
  const cudaDataType_t in = gg::operand_type(A_RK, W, C_RN), out = gg::cuda_type(C_RN.dtype());
  MOE_ASSERT_MSG(W.ndim() == 3, "grouped GEMM weights must be [E, rows, cols], got {}", W.shape().str());
  const int64_t E = W.dim(0), K = A_RK.cols(), N = C_RN.cols(), R = A_RK.rows();
  if (R == 0 && C_RN.rows() == 0) return;  // no rows at all (an empty input may have lost its column count)
  MOE_ASSERT_MSG((trans_w ? W.dim(1) == N && W.dim(2) == K : W.dim(1) == K && W.dim(2) == N) && C_RN.rows() == R,
                 "grouped GEMM {} · {}{} -> {}", A_RK.shape().str(), W.shape().str(), trans_w ? "ᵀ" : "",
                 C_RN.shape().str());
  gg::check_rows(row_begin, rows, E, R);
  const int64_t es = static_cast<int64_t>(dtype_size(A_RK.dtype())),
                cs = static_cast<int64_t>(dtype_size(C_RN.dtype()));
  const char* w = static_cast<const char*>(W.raw());
  const char* a = static_cast<const char*>(A_RK.raw());
  char* c = static_cast<char*>(C_RN.raw());
  // cuBLAS's A is the expert's weight, B the expert's rows of A_RK, C its rows of C_RN.
  std::vector<gg::Problem> ps;
  for (size_t e = 0; e < rows.size(); e++) {
    if (rows[e] == 0) continue;
    if (K == 0) {  // no inner dimension: C_e = 0
      C_RN.slice(row_begin[e], rows[e]).zero_();
      continue;
    }
    const int64_t r0 = row_begin[e];
    ps.push_back(gg::Problem{trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, gg::as_int(N, "N"),
                             gg::as_int(rows[e], "rows"), gg::as_int(K, "K"), w + static_cast<int64_t>(e) * N * K * es,
                             gg::as_int(trans_w ? K : N, "lda"), a + r0 * K * es, gg::as_int(K, "ldb"), c + r0 * N * cs,
                             gg::as_int(N, "ldc")});
  }
  if (N > 0 && !ps.empty()) gg::run_lt_streams(A_RK.device(), ps, in, out, 1.0f, 0.0f);
}

void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows, float beta) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kGemm);
  const cudaDataType_t in = gg::operand_type(dY_RN, X_RK, dW_ENK);
  MOE_ASSERT_MSG(dW_ENK.dtype() == DType::F32, "grouped weight gradients accumulate in f32, got {}",
                 dtype_name(dW_ENK.dtype()));
  const int64_t E = dW_ENK.dim(0), N = dY_RN.cols(), K = X_RK.cols(), R = dY_RN.rows();
  if (R == 0 && X_RK.rows() == 0) return;  // no rows: no expert's gradient is touched
  MOE_ASSERT_MSG(dW_ENK.ndim() == 3 && dW_ENK.dim(1) == N && dW_ENK.dim(2) == K && X_RK.rows() == R,
                 "grouped weight gradient {}ᵀ · {} -> {}", dY_RN.shape().str(), X_RK.shape().str(),
                 dW_ENK.shape().str());
  gg::check_rows(row_begin, rows, E, R);
  const int64_t es = static_cast<int64_t>(dtype_size(X_RK.dtype()));
  const char* x = static_cast<const char*>(X_RK.raw());
  const char* dy = static_cast<const char*>(dY_RN.raw());
  char* dw = static_cast<char*>(dW_ENK.raw());
  // cuBLAS's A is the expert's rows of X, B its rows of dY, C the expert's gradient.
  std::vector<gg::Problem> ps;
  for (size_t e = 0; e < rows.size(); e++) {
    if (rows[e] == 0) continue;  // adds nothing
    const int64_t r0 = row_begin[e];
    ps.push_back(
        gg::Problem{CUBLAS_OP_N, CUBLAS_OP_T, gg::as_int(K, "K"), gg::as_int(N, "N"), gg::as_int(rows[e], "rows"),
                    x + r0 * K * es, gg::as_int(K, "lda"), dy + r0 * N * es, gg::as_int(N, "ldb"),
                    dw + static_cast<int64_t>(e) * N * K * static_cast<int64_t>(sizeof(float)), gg::as_int(K, "ldc")});
  }
  if (N > 0 && K > 0 && !ps.empty()) gg::run_lt_streams(dY_RN.device(), ps, in, CUDA_R_32F, 1.0f, beta);
}

// This backend's table (kernels/backends.h).
const GemmKernels kGemmKernels{gemm, gemm_batched, grouped_gemm, grouped_gemm_wgrad, grouped_gemm_row_align};

}  // namespace moecore::kernels::cuda
