// Grouped expert GEMMs (see grouped_gemm.h). Row-major products are computed as their column-major transposes, as in
// gemm_cublaslt.cpp: C_e[r, N] = A_e[r, K]·op(W_e) is Cᵀ = op(W_e)ᵀ·A_eᵀ with m = N, n = r, k = K, and the weight
// gradient dW_e[N, K] += dY_eᵀ·X_e is dWᵀ = X_eᵀ·dY_e with m = K, n = N, k = r. Each expert with rows is one
// problem; the problem list is built on the host from the row counts (already there: the dispatch copied them).
//   (a) kGrouped: one cublasGemmGroupedBatchedEx call per GEMM, every expert its own group of one; the A/B/C pointer
//       arrays are written on the device by a small kernel whose arguments carry the problem list
//       (grouped_gemm_ptrs.cu): two launches, no host-to-device copy. Operand/output types cuBLAS offers for the
//       grouped call: f32 → f32 and bf16 → bf16 (f32 compute). bf16 → f32 (the weight gradients accumulated into f32
//       under bf16, an f32 fc1 output under expert biases) is not offered: those run as (b).
//   (b) kLoop: one cuBLASLt matmul per expert, experts dealt round-robin over kStreams streams that wait for the
//       caller's stream and are waited on by it (events); each stream has its own workspace.
// Both are deterministic: no atomics or split-K reductions are requested, and each output has one writer. They may
// differ from each other in the last bit (different kernels), never from run to run.
#include "moecore/kernels/cuda/grouped_gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_grouped.h"

namespace moecore::kernels::cuda {

// Named, not anonymous: the unity build puts this file beside gemm_cublaslt.cpp, whose anonymous names (Ctx, Plan)
// would collide.
namespace grouped_detail {
constexpr int kStreams = 4;
constexpr size_t kLtWorkspace = size_t(32) << 20;

std::atomic<int> g_impl{-1};  // −1: not chosen yet (read the environment on first use)
std::atomic<int64_t> g_grouped_calls{0}, g_loop_calls{0}, g_refused_calls{0};
// Type combinations cuBLAS refused a grouped call for (bit refusal_bit): every later call of them loops.
std::atomic<unsigned> g_refused_types{0};

// Where a problem's operands live, for the device pointer builder: operand o of the problem is
// base[o] + row·row_stride[o] + expert·expert_stride[o] (GroupedPtrArgs).
struct Operands {
  const char* base[3];
  int64_t row_stride[3];
  int64_t expert_stride[3];
};

struct Problem {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void* A;
  int lda;
  const void* B;
  int ldb;
  void* C;
  int ldc;
  int32_t expert;  // the expert and first row it covers (for the device pointer builder)
  int64_t row;
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
  cublasHandle_t blas = nullptr;
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
  if (!dc.blas) {
    MOE_CUBLAS_CHECK(cublasCreate(&dc.blas));
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

void run_lt_streams(Device d, const std::vector<Problem>& ps, cudaDataType_t in, cudaDataType_t out, float alpha,
                    float beta);

unsigned refusal_bit(cudaDataType_t in, cudaDataType_t out) {
  return 1u << ((in == CUDA_R_16BF ? 1 : 0) + (out == CUDA_R_16BF ? 2 : 0) + (allow_tf32() ? 4 : 0));
}

// The types cuBLAS offers cublasGemmGroupedBatchedEx (f32 compute): f32 → f32 and bf16 → bf16; not those this
// process's cuBLAS refused.
bool grouped_offers(cudaDataType_t in, cudaDataType_t out) {
  return in == out && (g_refused_types.load() & refusal_bit(in, out)) == 0;
}

// The device pointer arrays of `ps` ([A | B | C], 3·G pointers) in `ptrs`, written by the builder kernel, at most
// kGroupedPtrsPerLaunch problems per launch.
void build_pointers(const std::vector<Problem>& ps, const Operands& ops, void** ptrs, cudaStream_t s) {
  const int64_t G = static_cast<int64_t>(ps.size());
  launch::GroupedPtrArgs a{};
  for (int o = 0; o < 3; o++) {
    a.base[o] = ops.base[o];
    a.row_stride[o] = ops.row_stride[o];
    a.expert_stride[o] = ops.expert_stride[o];
  }
  for (int64_t first = 0; first < G; first += launch::kGroupedPtrsPerLaunch) {
    a.count = static_cast<int>(std::min<int64_t>(launch::kGroupedPtrsPerLaunch, G - first));
    for (int g = 0; g < a.count; g++) {
      a.expert[g] = ps[static_cast<size_t>(first + g)].expert;
      a.row[g] = ps[static_cast<size_t>(first + g)].row;
    }
    launch::grouped_gemm_pointers(a, ptrs, G, first, s);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
}

// One cublasGemmGroupedBatchedEx call over every problem; the loop (run_lt_streams) where cuBLAS does not offer the
// types or refuses the call.
void run_grouped(Device d, const std::vector<Problem>& ps, const Operands& ops, cudaDataType_t in, cudaDataType_t out,
                 float alpha, float beta) {
  if (!grouped_offers(in, out)) {
    g_loop_calls++;
    return run_lt_streams(d, ps, in, out, alpha, beta);
  }
  const cudaStream_t s = moecore::cuda::current_stream();
  cublasHandle_t h;
  {
    std::lock_guard<std::mutex> lock(ctx().mu);
    h = device_ctx(d.index).blas;
  }
  MOE_CUBLAS_CHECK(cublasSetStream(h, s));
  const size_t G = ps.size();
  std::vector<cublasOperation_t> ta(G), tb(G);
  std::vector<int> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), group_size(G, 1);
  std::vector<float> alphas(G, alpha), betas(G, beta);
  for (size_t g = 0; g < G; g++) {
    const Problem& p = ps[g];
    ta[g] = p.ta, tb[g] = p.tb, m[g] = p.m, n[g] = p.n, k[g] = p.k, lda[g] = p.lda, ldb[g] = p.ldb, ldc[g] = p.ldc;
  }
  // Stream-ordered from the caching allocator: freed when this returns, reused only by work queued after the GEMM.
  Tensor dev_ptrs = Tensor::empty({static_cast<int64_t>(3 * G)}, DType::I64, d);
  void** dp = static_cast<void**>(dev_ptrs.raw());
  build_pointers(ps, ops, dp, s);
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alphas.data(), const_cast<const void* const*>(dp), in,
      lda.data(), const_cast<const void* const*>(dp + G), in, ldb.data(), betas.data(), dp + 2 * G, out, ldc.data(),
      static_cast<int>(G), group_size.data(), compute_type(in));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    // Said once per type combination; the loop computes the same products (the problem list was checked above, so
    // a refusal is cuBLAS's, not a bad argument of ours).
    if ((g_refused_types.fetch_or(refusal_bit(in, out)) & refusal_bit(in, out)) == 0)
      fmt::print(stderr,
                 "moecore: cublasGemmGroupedBatchedEx refuses {} operands with a {} output ({}); those grouped GEMMs "
                 "run as one cuBLASLt matmul per expert\n",
                 in == CUDA_R_16BF ? "bf16" : (allow_tf32() ? "f32 (TF32)" : "f32"),
                 out == CUDA_R_16BF ? "bf16" : "f32", cublasGetStatusString(st));
    g_refused_calls++;
    g_loop_calls++;
    return run_lt_streams(d, ps, in, out, alpha, beta);
  }
  MOE_CUBLAS_CHECK(st);
  g_grouped_calls++;
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
  const cudaStream_t s = moecore::cuda::current_stream();
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

void run(Device d, const std::vector<Problem>& ps, const Operands& ops, cudaDataType_t in, cudaDataType_t out,
         float beta) {
  if (ps.empty()) return;
  if (grouped_gemm_impl() == GroupedGemmImpl::kGrouped) return run_grouped(d, ps, ops, in, out, 1.0f, beta);
  g_loop_calls++;
  run_lt_streams(d, ps, in, out, 1.0f, beta);
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

void set_grouped_gemm_impl(GroupedGemmImpl impl) {
  gg::g_impl = static_cast<int>(impl);
}

GroupedGemmImpl grouped_gemm_impl() {
  int v = gg::g_impl.load();
  if (v < 0) {
    const char* env = std::getenv("MOECORE_GROUPED_GEMM");
    const std::string s = env ? env : "";
    MOE_CHECK(s.empty() || s == "grouped" || s == "loop", "MOECORE_GROUPED_GEMM={} is not one of: grouped, loop", s);
    // The one-launch grouped call is the default wherever cuBLAS offers the types (with bf16 outputs: the forward
    // and data-gradient GEMMs under --bf16; everything in f32); the per-expert loop runs the rest. `moecore bench
    // grouped-gemm` and `bench moe-layer --device cuda` print both (docs/performance.md).
    v = static_cast<int>(s == "loop" ? GroupedGemmImpl::kLoop : GroupedGemmImpl::kGrouped);
    gg::g_impl = v;
  }
  return static_cast<GroupedGemmImpl>(v);
}

GroupedGemmCalls grouped_gemm_calls() {
  return {gg::g_grouped_calls.load(), gg::g_loop_calls.load(), gg::g_refused_calls.load()};
}

void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows) {
  const moecore::cuda::PhaseScope phase(moecore::cuda::Phase::kGemm);
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
  // cuBLAS's A is the expert's weight, B the expert's rows of A_RK, C its rows of C_RN.
  const gg::Operands ops{
      {static_cast<const char*>(W.raw()), static_cast<const char*>(A_RK.raw()), static_cast<const char*>(C_RN.raw())},
      {0, K * es, N * cs},
      {N * K * es, 0, 0}};
  std::vector<gg::Problem> ps;
  for (size_t e = 0; e < rows.size(); e++) {
    if (rows[e] == 0) continue;
    if (K == 0) {  // no inner dimension: C_e = 0
      C_RN.slice(row_begin[e], rows[e]).zero_();
      continue;
    }
    const int32_t ei = static_cast<int32_t>(e);
    const int64_t r0 = row_begin[e];
    ps.push_back(gg::Problem{trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, gg::as_int(N, "N"),
                             gg::as_int(rows[e], "rows"), gg::as_int(K, "K"), ops.base[0] + ei * ops.expert_stride[0],
                             gg::as_int(trans_w ? K : N, "lda"), ops.base[1] + r0 * ops.row_stride[1],
                             gg::as_int(K, "ldb"), const_cast<char*>(ops.base[2] + r0 * ops.row_stride[2]),
                             gg::as_int(N, "ldc"), ei, r0});
  }
  if (N > 0) gg::run(A_RK.device(), ps, ops, in, out, 0.0f);
}

void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows) {
  const moecore::cuda::PhaseScope phase(moecore::cuda::Phase::kGemm);
  const cudaDataType_t in = gg::operand_type(dY_RN, X_RK, dW_ENK);
  MOE_ASSERT_MSG(dW_ENK.dtype() == DType::F32, "grouped weight gradients accumulate in f32, got {}",
                 dtype_name(dW_ENK.dtype()));
  const int64_t E = dW_ENK.dim(0), N = dY_RN.cols(), K = X_RK.cols(), R = dY_RN.rows();
  if (R == 0 && X_RK.rows() == 0) return;  // no rows: nothing to add
  MOE_ASSERT_MSG(dW_ENK.ndim() == 3 && dW_ENK.dim(1) == N && dW_ENK.dim(2) == K && X_RK.rows() == R,
                 "grouped weight gradient {}ᵀ · {} -> {}", dY_RN.shape().str(), X_RK.shape().str(),
                 dW_ENK.shape().str());
  gg::check_rows(row_begin, rows, E, R);
  const int64_t es = static_cast<int64_t>(dtype_size(X_RK.dtype()));
  // cuBLAS's A is the expert's rows of X, B its rows of dY, C the expert's gradient.
  const gg::Operands ops{{static_cast<const char*>(X_RK.raw()), static_cast<const char*>(dY_RN.raw()),
                          static_cast<const char*>(dW_ENK.raw())},
                         {K * es, N * es, 0},
                         {0, 0, N * K * static_cast<int64_t>(sizeof(float))}};
  std::vector<gg::Problem> ps;
  for (size_t e = 0; e < rows.size(); e++) {
    if (rows[e] == 0) continue;  // adds nothing
    const int32_t ei = static_cast<int32_t>(e);
    const int64_t r0 = row_begin[e];
    ps.push_back(gg::Problem{CUBLAS_OP_N, CUBLAS_OP_T, gg::as_int(K, "K"), gg::as_int(N, "N"),
                             gg::as_int(rows[e], "rows"), ops.base[0] + r0 * ops.row_stride[0], gg::as_int(K, "lda"),
                             ops.base[1] + r0 * ops.row_stride[1], gg::as_int(N, "ldb"),
                             const_cast<char*>(ops.base[2] + ei * ops.expert_stride[2]), gg::as_int(K, "ldc"), ei, r0});
  }
  if (N > 0 && K > 0) gg::run(dY_RN.device(), ps, ops, in, CUDA_R_32F, 1.0f);
}

}  // namespace moecore::kernels::cuda
