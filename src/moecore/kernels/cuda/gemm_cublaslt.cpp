// GEMM through cuBLASLt (see kernels.h). Row-major C[M,N] = op(A)·op(B) is computed as the column-major product
// Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ, which reads the row-major buffers as they are. Per GPU: one handle and one 32 MiB
// workspace; per shape: the matmul descriptor, the three layouts and the heuristic's first algorithm, cached, so a
// steady-state step creates nothing. cuBLASLt's algorithms do not use atomics unless asked: reruns are bitwise.
#include <cublasLt.h>

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

namespace {
constexpr size_t kWorkspace = size_t(32) << 20;
std::atomic<bool> g_tf32{false};

struct Key {
  int device;
  int64_t M, N, K, batch;
  bool ta, tb;
  DType dtype;
  bool tf32;
  uint32_t align_a, align_b, align_c;  // of the pointers, in bytes (the heuristic otherwise assumes 256)
  auto tie() const { return std::tie(device, M, N, K, batch, ta, tb, dtype, tf32, align_a, align_b, align_c); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct DeviceCtx {
  cublasLtHandle_t handle = nullptr;
  // One workspace per stream: GEMMs on two streams at once (--moe-shared-expert-overlap) must not share one.
  std::map<cudaStream_t, void*> workspaces;
};

struct Ctx {
  std::mutex mu;
  std::map<int, DeviceCtx> devices;
  std::map<Key, Plan> plans;
};
Ctx& ctx() {
  static Ctx* c = new Ctx();  // never destroyed: the driver may be gone at static destruction
  return *c;
}

cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch) {
  cublasLtMatrixLayout_t l = nullptr;
  MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld));
  if (batch > 0) {
    const int32_t count = static_cast<int32_t>(batch);
    const int64_t stride = rows * cols;
    MOE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    MOE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

Plan make_plan(DeviceCtx& dc, const Key& k, int64_t a_rows, int64_t a_cols, int64_t b_rows, int64_t b_cols) {
  Plan p;
  const cudaDataType_t in = k.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      k.dtype == DType::F32 && k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  // Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's "A" is our B, its "B" is our A.
  const cublasOperation_t op_a = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  p.a = layout(in, b_cols, b_rows, b_cols, k.batch);
  p.b = layout(in, a_cols, a_rows, a_cols, k.batch);
  p.c = layout(CUDA_R_32F, k.N, k.M, k.N, k.batch);
  cublasLtMatmulPreference_t pref = nullptr;
  MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                        sizeof kWorkspace));
  // Views (slices) need not be 256-byte aligned: tell the heuristic what the pointers really are. Its "A" is our B.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c}};
  for (const auto& [attr, bytes] : aligns)
    MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MOE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(dc.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  MOE_ASSERT_MSG(found > 0, "cuBLASLt has no algorithm for M={} N={} K={} ({})", k.M, k.N, k.K, dtype_name(k.dtype));
  p.algo = result.algo;
  return p;
}
// The largest power of two (up to 256) that divides the address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t b = 256;
  while (b > 1 && a % b != 0) b /= 2;
  return b;
}
}  // namespace

void set_allow_tf32(bool on) {
  g_tf32 = on;
}
bool allow_tf32() {
  return g_tf32;
}

namespace {
// batch = 0: 2-D product of the flattened matrices; batch > 0: A, B, C are [batch, rows, cols].
void matmul(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta,
            int64_t batch) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kGemm);
  const int64_t a_rows = batch ? A.dim(1) : A.rows(), b_rows = batch ? B.dim(1) : B.rows();
  const int64_t a_cols = A.cols(), b_cols = B.cols();
  const int64_t M = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
  const int64_t Kb = trans_b ? b_cols : b_rows, N = trans_b ? b_rows : b_cols;
  MOE_ASSERT_MSG(K == Kb, "gemm inner dims differ: A {}{} vs B {}{}", A.shape().str(), trans_a ? "ᵀ" : "",
                 B.shape().str(), trans_b ? "ᵀ" : "");
  MOE_ASSERT_MSG((batch ? C.dim(1) : C.rows()) == M && C.cols() == N, "gemm output {} expected [{}, {}]",
                 C.shape().str(), M, N);
  MOE_ASSERT_MSG(A.dtype() == B.dtype() && (A.dtype() == DType::F32 || A.dtype() == DType::BF16),
                 "GPU gemm takes f32 or bf16 operands of one dtype, got {} and {}", dtype_name(A.dtype()),
                 dtype_name(B.dtype()));
  MOE_ASSERT_MSG(C.dtype() == DType::F32, "gemm output must be f32, got {}", dtype_name(C.dtype()));
  MOE_ASSERT_MSG(A.device().is_cuda() && B.device() == A.device() && C.device() == A.device(),
                 "GPU gemm operands on {}, {}, {}", A.device().str(), B.device().str(), C.device().str());
  if (M == 0 || N == 0) return;
  if (K == 0) {  // cuBLASLt rejects K = 0: C = beta·C
    if (beta == 0.0f)
      C.zero_();
    else
      scale_(C, beta);
    return;
  }
  Key key{A.device().index, M, N, K, batch, trans_a, trans_b, A.dtype(), g_tf32.load(), 0, 0, 0};
  key.align_a = alignment(A.raw()), key.align_b = alignment(B.raw()), key.align_c = alignment(C.raw());
  Ctx& c = ctx();
  cublasLtHandle_t handle;
  void* workspace;
  const Plan* plan;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    DeviceCtx& dc = c.devices[key.device];
    if (!dc.handle) MOE_CUBLAS_CHECK(cublasLtCreate(&dc.handle));
    void*& ws = dc.workspaces[moecore::device::current_stream()];
    if (!ws) MOE_CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
    auto it = c.plans.find(key);
    if (it == c.plans.end()) it = c.plans.emplace(key, make_plan(dc, key, a_rows, a_cols, b_rows, b_cols)).first;
    handle = dc.handle, workspace = ws, plan = &it->second;  // map nodes are stable
  }
  MOE_CUBLAS_CHECK(cublasLtMatmul(handle, plan->desc, &alpha, B.raw(), plan->a, A.raw(), plan->b, &beta, C.raw(),
                                  plan->c, C.raw(), plan->c, &plan->algo, workspace, kWorkspace,
                                  moecore::device::current_stream()));
}
}  // namespace

void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  matmul(A, trans_a, B, trans_b, C, alpha, beta, 0);
}

void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  MOE_ASSERT_MSG(A.ndim() == 3, "batched gemm wants [batch, rows, cols] operands, got A {}", A.shape().str());
  if (A.dim(0) > 0) matmul(A, trans_a, B, trans_b, C, alpha, beta, A.dim(0));
}

}  // namespace moecore::kernels::cuda
