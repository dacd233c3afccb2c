// GEMM through oneDNN matmul with a primitive cache (see gemm.h).
#include "moecore/kernels/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/core/timer.h"
#include "moecore/kernels/cpu/gemm_context.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels {

namespace gemm_detail {

Ctx& ctx() {
  static Ctx* c = new Ctx();
  return *c;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

Scratchpad::~Scratchpad() {
  std::free(p_);
}

void* Scratchpad::get(size_t bytes) {
  if (bytes <= bytes_) return p_;
  std::free(p_);
  bytes_ = (bytes + 4095) & ~size_t(4095);
  p_ = std::aligned_alloc(4096, bytes_);
  MOE_CHECK(p_ != nullptr, "out of host memory: could not allocate {} bytes for oneDNN's scratchpad", bytes_);
  return p_;
}

void bind_scratchpad(Ctx& c, dnnl::memory& scratch, std::unordered_map<int, dnnl::memory>& args) {
  const size_t bytes = scratch.get_desc().get_size();
  if (bytes == 0) return;
  scratch.set_data_handle(c.scratch.get(bytes));
  args.emplace(DNNL_ARG_SCRATCHPAD, scratch);
}

dnnl::memory::data_type dnnl_dt(DType t) {
  return t == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

Descs make_descs(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype, int64_t lda,
                 int64_t ldb, DType cdtype) {
  using dims = dnnl::memory::dims;
  auto dt = dnnl_dt(dtype);
  if (batch == 0)
    return Descs{dnnl::memory::desc(dims{m, k}, dt, ta ? dims{1, lda ? lda : m} : dims{lda ? lda : k, 1}),
                 dnnl::memory::desc(dims{k, n}, dt, tb ? dims{1, ldb ? ldb : k} : dims{ldb ? ldb : n, 1}),
                 dnnl::memory::desc(dims{m, n}, dnnl_dt(cdtype), dims{n, 1})};
  return Descs{dnnl::memory::desc(dims{batch, m, k}, dt, ta ? dims{m * k, 1, m} : dims{m * k, k, 1}),
               dnnl::memory::desc(dims{batch, k, n}, dt, tb ? dims{k * n, 1, k} : dims{k * n, n, 1}),
               dnnl::memory::desc(dims{batch, m, n}, dnnl::memory::data_type::f32, dims{m * n, n, 1})};
}

// Creates the matmul for one key.
Entry make_entry(Ctx& c, const Key& k) {
  Descs d = make_descs(k.batch, k.m, k.n, k.k, k.ta, k.tb, k.dt, k.lda, k.ldb, k.ct);
  if (k.packed) d.b = dnnl::memory::desc({k.k, k.n}, dnnl_dt(k.dt), dnnl::memory::format_tag::any);
  const dnnl::memory::desc &a_md = d.a, &b_md = d.b, &c_md = d.c;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // see Scratchpad
  float alpha, beta;
  std::memcpy(&alpha, &k.alpha_bits, 4);
  std::memcpy(&beta, &k.beta_bits, 4);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, c.eng);
  Entry e{dnnl::matmul(pd), {}, {}, {}, dnnl::memory(pd.scratchpad_desc(), c.eng, DNNL_MEMORY_NONE)};
  // Memory objects are kept; each call only swaps their pointers.
  e.a = dnnl::memory(a_md, c.eng, DNNL_MEMORY_NONE);
  e.b = dnnl::memory(k.packed ? pd.weights_desc() : b_md, c.eng, DNNL_MEMORY_NONE);
  e.c = dnnl::memory(c_md, c.eng, DNNL_MEMORY_NONE);
  c.stats.primitives_created++;
  return e;
}

bool cap_onednn_isa() {
  using dnnl::cpu_isa;
  switch (max_cpu_isa()) {
    case CpuIsa::Sse41:
      dnnl::set_max_cpu_isa(cpu_isa::sse41);
      return true;
    case CpuIsa::Avx2:
      dnnl::set_max_cpu_isa(cpu_isa::avx2);
      return true;
    case CpuIsa::Avx512:
      dnnl::set_max_cpu_isa(cpu_isa::avx512_core);
      return true;
    case CpuIsa::Avx512Bf16:
      dnnl::set_max_cpu_isa(cpu_isa::avx512_core_bf16);
      return true;
    case CpuIsa::Amx:
      break;  // no cap: oneDNN's own default (and its ONEDNN_MAX_CPU_ISA) holds
  }
  return false;
}

// CPUs without AVX-512 have no bf16 matmul in oneDNN: find out once, then widen bf16 operands to f32 there.
Ctx::Ctx() {
  using dims = dnnl::memory::dims;
  try {
    dnnl::memory::desc a(dims{2, 2}, dnnl::memory::data_type::bf16, dims{2, 1});
    dnnl::memory::desc c(dims{2, 2}, dnnl::memory::data_type::f32, dims{2, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
  } catch (const dnnl::error&) {
    stats.bf16_native = false;
  }
}

Entry& entry_locked(Ctx& c, const Key& key) {
  auto it = c.cache.find(key);
  if (it == c.cache.end()) {
    try {
      it = c.cache.emplace(key, make_entry(c, key)).first;
    } catch (const dnnl::error& e) {
      MOE_ASSERT_MSG(false, "oneDNN matmul creation failed ({}) for M={} N={} K={}", e.what(), key.m, key.n, key.k);
    }
  }
  return it->second;
}

bool run(Ctx& c, const Key& key, const void* A, const void* B, void* C, int64_t M, int64_t N, int64_t K, int b_layout) {
  std::lock_guard<std::mutex> lock(c.mu);
  Entry& e = entry_locked(c, key);
  if (b_layout >= 0 && !(e.b.get_desc() == c.layouts[static_cast<size_t>(b_layout)])) return false;
  c.stats.calls++;
  void* a_ptr = const_cast<void*>(A);  // oneDNN's handles are non-const; sources are only read
  void* b_ptr = const_cast<void*>(B);
  const Stopwatch timer;
  try {
    e.a.set_data_handle(a_ptr);
    e.b.set_data_handle(b_ptr);
    e.c.set_data_handle(C);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}};
    bind_scratchpad(c, e.scratch, args);
    e.prim.execute(c.strm, args);
    c.strm.wait();
  } catch (const dnnl::error& err) {
    MOE_ASSERT_MSG(false, "oneDNN matmul failed ({}) for M={} N={} K={}", err.what(), M, N, K);
  }
  const double dt = timer.seconds(), flops = 2.0 * static_cast<double>(std::max<int64_t>(key.batch, 1)) *
                                             static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  c.stats.seconds += dt;
  c.stats.flops += flops;
  e.calls++;
  e.seconds += dt;
  e.flops += flops;
  return true;
}
}  // namespace gemm_detail

using namespace gemm_detail;

namespace {

template <typename T>
void gemm_ref(const T* A, bool ta, const T* B, bool tb, T* C, int64_t M, int64_t N, int64_t K, T alpha, T beta) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; i++) {
    T* c = C + i * N;
    for (int64_t j = 0; j < N; j++) c[j] = beta == T(0) ? T(0) : beta * c[j];
    for (int64_t p = 0; p < K; p++) {
      T a = alpha * (ta ? A[p * M + i] : A[i * K + p]);
      if (tb) {
        for (int64_t j = 0; j < N; j++) c[j] += a * B[j * K + p];
      } else {
        const T* b = B + p * N;
        for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
      }
    }
  }
}

}  // namespace

namespace {
void gemm_impl(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta,
               int64_t batch = 0);

// Rows [r0, r0 + nr) and columns [c0, c0 + nc) of the row-major bf16 (or f16) matrix x [rows, cols], widened to f32
// into dst [nr, nc].
void widen_block(const Tensor& x, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* dst) {
  const int64_t cols = x.cols();
  if (x.dtype() == DType::F16) {
    const f16* src = x.data<f16>();
#pragma omp parallel for schedule(static) if (nr * nc >= (1 << 16))
    for (int64_t r = 0; r < nr; r++) {
      const f16* s = src + (r0 + r) * cols + c0;
      float* d = dst + r * nc;
      for (int64_t j = 0; j < nc; j++) d[j] = f16_to_float(s[j]);
    }
    return;
  }
  const auto* src = reinterpret_cast<const uint16_t*>(x.data<bf16>());
#pragma omp parallel for schedule(static) if (nr * nc >= (1 << 16))
  for (int64_t r = 0; r < nr; r++) {
    const uint16_t* s = src + (r0 + r) * cols + c0;
    float* d = dst + r * nc;
#pragma omp simd
    for (int64_t j = 0; j < nc; j++) {  // bf16 is the high half of an f32
      const uint32_t u = static_cast<uint32_t>(s[j]) << 16;
      std::memcpy(d + j, &u, 4);
    }
  }
}

// A bf16 product on a CPU without bf16 matmul, and every f16 product (--fp16): the operands widened to f32 block by
// block, so a wide bf16 operand (the output layer's [tokens, vocabulary] gradient) never has a whole f32 copy: K in the
// long-reduction chunks (gemm_impl's own), M in blocks of about kWidenBlock f32 elements of A. Each element of C still
// receives the K chunks in order; a bf16 C (beta 0) is the f32 product rounded after. The blocks (and a bf16 C's f32
// product) live in Ctx::widened, not in tensors: their sizes follow M and K, which for the experts' products follow the
// routing, and per-call tensors would take new size classes from the system in any step.
constexpr int64_t kWidenBlock = int64_t{1} << 22;
void gemm_widened(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta,
                  int64_t M, int64_t N, int64_t K) {
  const Tensor A2 = A.reshape({A.rows(), A.cols()}), B2 = B.reshape({B.rows(), B.cols()});
  const int64_t chunks = K >= kLongReduction ? (K + kReductionChunk - 1) / kReductionChunk : 1;
  const int64_t kc = (K + chunks - 1) / chunks, mb = std::clamp<int64_t>(kWidenBlock / kc, 1, M);
  const bool round = is_half(C.dtype());
  const auto f32 = [](int64_t n) { return (static_cast<size_t>(n) * 4 + 63) & ~size_t(63); };
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.widened_mu);  // one workspace: widened products run one at a time
  char* ws = static_cast<char*>(c.widened.get(f32(mb * kc) + f32(kc * N) + (round ? f32(M * N) : 0)));
  float* a = reinterpret_cast<float*>(ws);
  float* b = reinterpret_cast<float*>(ws + f32(mb * kc));
  float* c32 = round ? reinterpret_cast<float*>(ws + f32(mb * kc) + f32(kc * N)) : C.data<float>();
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t n = std::min(kc, K - k0);
    if (trans_b)
      widen_block(B2, 0, N, k0, n, b);
    else
      widen_block(B2, k0, n, 0, N, b);
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
      const int64_t m = std::min(mb, M - m0);
      if (trans_a)
        widen_block(A2, k0, n, m0, m, a);
      else
        widen_block(A2, m0, m, k0, n, a);
      run(c, Key{0, m, N, n, 0, 0, trans_a, trans_b, DType::F32, bits(alpha), bits(k0 == 0 ? beta : 1.0f)}, a, b,
          c32 + m0 * N, m, N, n);
    }
  }
  if (round && C.dtype() == DType::F16) {
    f16* d = C.data<f16>();
    const int64_t total = M * N;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < total; i++) d[i] = float_to_f16(c32[i]);
  } else if (round) {
    uint16_t* d = reinterpret_cast<uint16_t*>(C.data<bf16>());
    const int64_t total = M * N;
#pragma omp parallel for simd schedule(static) if (total > 65536)
    for (int64_t i = 0; i < total; i++) d[i] = float_to_bf16(c32[i]).bits;
  }
}

}  // namespace

namespace {

// batch = 0: 2-D product of the flattened matrices; batch > 0: A, B, C are [batch, rows, cols].
void gemm_impl(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta,
               int64_t batch) {
  const int64_t a_rows = batch ? A.dim(1) : A.rows(), b_rows = batch ? B.dim(1) : B.rows();
  const int64_t M = trans_a ? A.cols() : a_rows;
  const int64_t K = trans_a ? a_rows : A.cols();
  const int64_t Kb = trans_b ? B.cols() : b_rows;
  const int64_t N = trans_b ? b_rows : B.cols();
  MOE_ASSERT_MSG(K == Kb, "gemm inner dims differ: A {}{} vs B {}{}", A.shape().str(), trans_a ? "ᵀ" : "",
                 B.shape().str(), trans_b ? "ᵀ" : "");
  if (batch) {
    MOE_ASSERT_MSG(
        A.ndim() == 3 && B.ndim() == 3 && C.ndim() == 3 && A.dim(0) == batch && B.dim(0) == batch && C.dim(0) == batch,
        "batched gemm wants [batch, rows, cols] operands, got A {} B {} C {}", A.shape().str(), B.shape().str(),
        C.shape().str());
    MOE_ASSERT(A.dtype() != DType::F64);
  }
  MOE_ASSERT_MSG((batch ? C.dim(1) : C.rows()) == M && C.cols() == N, "gemm output {} expected [{}, {}]",
                 C.shape().str(), M, N);
  MOE_ASSERT_MSG(A.dtype() == B.dtype(), "gemm operand dtypes differ: {} vs {}", dtype_name(A.dtype()),
                 dtype_name(B.dtype()));
  Ctx& c = ctx();
  if (A.dtype() == DType::F64) {
    MOE_ASSERT(C.dtype() == DType::F64);
    c.stats.calls++;
    gemm_ref<double>(A.data<double>(), trans_a, B.data<double>(), trans_b, C.data<double>(), M, N, K, alpha, beta);
    return;
  }
  if (C.dtype() == DType::F16) {
    // An f16 output (beta 0): the f32 product of the widened operands, rounded after (products of 11-bit
    // significands are exact in f32, so only the accumulation order and the final rounding are the GEMM's).
    MOE_ASSERT_MSG(A.dtype() == DType::F16 && beta == 0.0f, "an f16 gemm output takes f16 operands and beta 0");
    if (batch == 0 && M > 0 && N > 0 && K > 0) {
      gemm_widened(A, trans_a, B, trans_b, C, alpha, beta, M, N, K);
      return;
    }
    Tensor c32 = Tensor::empty(C.shape(), DType::F32);
    gemm_impl(A, trans_a, B, trans_b, c32, alpha, beta, batch);
    C.copy_from(c32);
    return;
  }
  if (C.dtype() == DType::BF16) {
    // A bf16 output (beta 0): oneDNN rounds as it writes, where it multiplies bf16 natively in one call; otherwise
    // (widened operands, chunked long reductions, batches) an f32 product rounded after, with the same rounding.
    MOE_ASSERT_MSG(A.dtype() == DType::BF16 && beta == 0.0f, "a bf16 gemm output takes bf16 operands and beta 0");
    if (batch == 0 && !c.stats.bf16_native && M > 0 && N > 0 && K > 0) {
      gemm_widened(A, trans_a, B, trans_b, C, alpha, beta, M, N, K);
      return;
    }
    if (batch == 0 && c.stats.bf16_native && K > 0 && K < kLongReduction) {
      if (M == 0 || N == 0) return;
      if (alpha == 1.0f && run_with_packed_b(c, A, trans_a, B, trans_b, C, beta, M, N, K)) return;
      run(c, Key{0, M, N, K, 0, 0, trans_a, trans_b, A.dtype(), bits(alpha), bits(beta), DType::BF16}, A.raw(), B.raw(),
          C.raw(), M, N, K);
      return;
    }
    Tensor c32 = Tensor::empty(C.shape(), DType::F32);
    gemm_impl(A, trans_a, B, trans_b, c32, alpha, beta, batch);
    C.copy_from(c32);
    return;
  }
  MOE_ASSERT_MSG(C.dtype() == DType::F32, "gemm output must be f32, bf16 or f16 for {} operands",
                 dtype_name(A.dtype()));
  if (M == 0 || N == 0) return;
  if (K == 0) {  // oneDNN rejects empty reductions: C = beta·C.
    float* cp = C.data<float>();
    for (int64_t i = 0; i < C.numel(); i++) cp[i] = beta == 0.0f ? 0.0f : beta * cp[i];
    return;
  }
  if ((A.dtype() == DType::BF16 && !c.stats.bf16_native) || A.dtype() == DType::F16) {
    if (batch == 0) {
      gemm_widened(A, trans_a, B, trans_b, C, alpha, beta, M, N, K);
      return;
    }
    Tensor a32 = A.to(DType::F32), b32 = B.to(DType::F32);
    gemm_impl(a32, trans_a, b32, trans_b, C, alpha, beta, batch);
    return;
  }
  const uint32_t ab = bits(alpha);
  if (batch == 0 && K >= kLongReduction) {
    // Long reductions (the output layer's data gradient, K = vocabulary) in chunks accumulated into C in a fixed
    // order: one oneDNN call streaming all of K runs at about half the rate of several calls of a few thousand.
    const int64_t chunks = (K + kReductionChunk - 1) / kReductionChunk, kc = (K + chunks - 1) / chunks;
    const size_t es = dtype_size(A.dtype());
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      const int64_t n = std::min(kc, K - k0);
      const char* a = static_cast<const char*>(A.raw()) + es * static_cast<size_t>(trans_a ? k0 * M : k0);
      const char* b = static_cast<const char*>(B.raw()) + es * static_cast<size_t>(trans_b ? k0 : k0 * N);
      run(c,
          Key{0, M, N, n, trans_a ? 0 : K, trans_b ? K : 0, trans_a, trans_b, A.dtype(), ab,
              bits(k0 == 0 ? beta : 1.0f)},
          a, b, C.raw(), M, N, n);
    }
    return;
  }
  if (batch == 0 && alpha == 1.0f && run_with_packed_b(c, A, trans_a, B, trans_b, C, beta, M, N, K)) return;
  run(c, Key{batch, M, N, K, 0, 0, trans_a, trans_b, A.dtype(), ab, bits(beta)}, A.raw(), B.raw(), C.raw(), M, N, K);
}

}  // namespace

namespace cpu {
void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  gemm_impl(A, trans_a, B, trans_b, C, alpha, beta);
}

void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  MOE_ASSERT_MSG(A.ndim() == 3, "batched gemm wants [batch, rows, cols] operands, got A {}", A.shape().str());
  if (A.dim(0) > 0) gemm_impl(A, trans_a, B, trans_b, C, alpha, beta, A.dim(0));
}
}  // namespace cpu

void gemm_prepare(int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType dtype, float alpha, float beta,
                  DType out) {
  MOE_ASSERT(dtype == DType::F32 || is_half(dtype));
  MOE_ASSERT(out == DType::F32 || (out == dtype && beta == 0.0f));
  // A long reduction runs in chunks whose primitives carry the whole operand's row stride: they are created on
  // first use (an expert's fc1 data gradient at Mixtral's size, K = 2F = 28,672).
  if (K >= kLongReduction) return;
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.mu);
  // Widened: an f32 product, rounded.
  if ((dtype == DType::BF16 && !c.stats.bf16_native) || dtype == DType::F16) dtype = out = DType::F32;
  const Key key{0, M, N, K, 0, 0, trans_a, trans_b, dtype, bits(alpha), bits(beta), out};
  if (M > 0 && N > 0 && K > 0) entry_locked(c, key);
}

std::string GemmShapeStats::describe() const {
  std::string s = batch ? fmt::format("{} x ", batch) : std::string();
  s += (M > 0 ? fmt::format("M={}", M) : std::string("M=*")) + fmt::format(" N={} K={}", N, K);
  if (trans_a || trans_b) s += fmt::format(" ({}{})", trans_a ? "Aᵀ" : "", trans_b ? "Bᵀ" : "");
  if (packed_b) s += " packed B";
  s += fmt::format(" {}->{}", dtype_name(dtype), dtype_name(out));
  if (beta != 0.0f) s += " +=";
  return s;
}

std::vector<GemmShapeStats> gemm_shape_stats() {
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.mu);
  std::vector<GemmShapeStats> v;
  for (const auto& [k, e] : c.cache) {
    GemmShapeStats g;
    g.batch = k.batch, g.M = k.m, g.N = k.n, g.K = k.k, g.trans_a = k.ta, g.trans_b = k.tb, g.dtype = k.dt;
    g.out = k.ct;
    g.packed_b = k.packed;
    std::memcpy(&g.beta, &k.beta_bits, 4);
    g.calls = e.calls, g.flops = e.flops, g.seconds = e.seconds;
    v.push_back(g);
  }
  return v;
}

GemmStats gemm_stats() {
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.mu);
  GemmStats st = c.stats;
  st.scratchpad_bytes = static_cast<int64_t>(c.scratch.capacity() + c.widened.capacity());
  return st;
}

}  // namespace moecore::kernels
