// Packed bf16 weights (see gemm.h PackedWeight): a weight reordered once into the blocked layout oneDNN's matmul
// reads, and the products that use it.
#include <cstdlib>
#include <string>

#include "moecore/core/allocator.h"
#include "moecore/core/timer.h"
#include "moecore/kernels/cpu/gemm_context.h"
#include "moecore/kernels/gemm.h"

namespace moecore::kernels {

using namespace gemm_detail;

namespace {
Key packed_key(int64_t m, int64_t n, int64_t k, bool trans, float beta, DType out, bool trans_a = false) {
  Key key{0, m, n, k, 0, 0, trans_a, trans, DType::BF16, bits(1.0f), bits(beta), out};
  key.packed = true;
  return key;
}

// Whether a product op(W) [K, N] with this weight is packed (PackedWeight): bf16 operands multiplied natively on
// the CPU, and a reduction short enough for one call.
bool packs(int64_t K, int64_t N) {
  return ctx().stats.bf16_native && K > 0 && N > 0 && K < kLongReduction;
}

// The blocked layout oneDNN chooses for op(W) [K, N] in products of m rows; c.mu held.
dnnl::memory::desc packed_layout_locked(Ctx& c, int64_t K, int64_t N, bool trans, int64_t m) {
  return entry_locked(c, packed_key(m, N, K, trans, 0.0f, DType::F32)).b.get_desc();
}

int layout_index_locked(Ctx& c, const dnnl::memory::desc& d) {
  for (size_t i = 0; i < c.layouts.size(); i++)
    if (c.layouts[i] == d) return static_cast<int>(i);
  c.layouts.push_back(d);
  return static_cast<int>(c.layouts.size()) - 1;
}

Packer& packer_locked(Ctx& c, int64_t K, int64_t N, bool trans, int layout) {
  for (Packer& p : c.packers)
    if (p.k == K && p.n == N && p.trans == trans && p.layout == layout) return p;
  const dnnl::memory::desc src = make_descs(0, 1, N, K, false, trans, DType::BF16).b;
  const dnnl::memory::desc& dst = c.layouts[static_cast<size_t>(layout)];
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // see Scratchpad
  const dnnl::reorder::primitive_desc pd(c.eng, src, c.eng, dst, attr);
  c.stats.primitives_created++;
  c.packers.push_back(Packer{K, N, trans, layout, dnnl::reorder(pd), dnnl::memory(src, c.eng, DNNL_MEMORY_NONE),
                             dnnl::memory(dst, c.eng, DNNL_MEMORY_NONE),
                             dnnl::memory(pd.scratchpad_desc(), c.eng, DNNL_MEMORY_NONE)});
  return c.packers.back();
}

// op(W) [K, N] (bf16, plain) reordered into blocked layout `layout`, into `buf` (grown to fit); c.mu held.
void pack_locked(Ctx& c, const Tensor& W, int64_t K, int64_t N, bool trans, int layout, Tensor& buf) {
  Packer& p = packer_locked(c, K, N, trans, layout);
  const int64_t bytes = static_cast<int64_t>(c.layouts[static_cast<size_t>(layout)].get_size());
  if (!buf.defined() || buf.nbytes() < static_cast<size_t>(bytes)) buf = Tensor::empty({(bytes + 1) / 2}, DType::BF16);
  try {
    p.src.set_data_handle(const_cast<void*>(W.raw()));
    p.dst.set_data_handle(buf.raw());
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, p.src}, {DNNL_ARG_TO, p.dst}};
    bind_scratchpad(c, p.scratch, args);
    p.prim.execute(c.strm, args);
    c.strm.wait();
  } catch (const dnnl::error& err) {
    MOE_ASSERT_MSG(false, "oneDNN operand reorder failed ({}) for K={} N={}", err.what(), K, N);
  }
}
}  // namespace

void pack_weight(const Tensor& W, bool trans, int64_t m, PackedWeight& into) {
  MOE_ASSERT_MSG(W.ndim() == 2, "pack_weight takes a 2-D weight, got {}", W.shape().str());
  into.plain = W;
  into.trans = trans;
  const int64_t K = trans ? W.cols() : W.rows(), N = trans ? W.rows() : W.cols();
  if (W.dtype() != DType::BF16 || !W.device().is_cpu() || m <= 0 || !packs(K, N)) {
    into.packed = Tensor();
    into.layout = -1;
    return;
  }
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.mu);
  const int layout = layout_index_locked(c, packed_layout_locked(c, K, N, trans, m));
  pack_locked(c, W, K, N, trans, layout, into.packed);
  into.layout = layout;
}

void gemm(const Tensor& A, const PackedWeight& W, Tensor& C, float beta) {
  if (!W.packed.defined()) return gemm(A, false, W.plain, W.trans, C, 1.0f, beta);
  const int64_t M = A.rows(), K = W.trans ? W.plain.cols() : W.plain.rows();
  const int64_t N = W.trans ? W.plain.rows() : W.plain.cols();
  MOE_ASSERT_MSG(A.dtype() == DType::BF16 && A.cols() == K && C.rows() == M && C.cols() == N,
                 "packed gemm: A {} ({}) times op(W) [{}, {}] into C {}", A.shape().str(), dtype_name(A.dtype()), K, N,
                 C.shape().str());
  MOE_ASSERT_MSG(C.dtype() == DType::F32 || beta == 0.0f, "a bf16 gemm output takes beta 0");
  if (M == 0) return;
  // Where oneDNN chose another layout for this shape: the plain weight, as an unpacked product would.
  if (!run(ctx(), packed_key(M, N, K, W.trans, beta, C.dtype()), A.raw(), W.packed.raw(), C.raw(), M, N, K,
           static_cast<int>(W.layout)))
    gemm(A, false, W.plain, W.trans, C, 1.0f, beta);
}

namespace {
// MOECORE_PACK_WEIGHTS: auto (the rules), on or off (every packing of weights and of large products' B).
const std::string& pack_mode() {
  static const std::string mode = [] {
    const char* env = std::getenv("MOECORE_PACK_WEIGHTS");
    const std::string m = env == nullptr || *env == '\0' ? "auto" : env;
    MOE_CHECK(m == "auto" || m == "on" || m == "off", "MOECORE_PACK_WEIGHTS='{}' is not auto, on or off", m);
    return m;
  }();
  return mode;
}
}  // namespace

bool pack_weights_for(int64_t micro_batches) {
  if (!ctx().stats.bf16_native || pack_mode() == "off") return false;
  return pack_mode() == "on" || micro_batches >= 4;
}

namespace gemm_detail {

bool run_with_packed_b(Ctx& c, const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float beta,
                       int64_t M, int64_t N, int64_t K) {
  if (M < kPackedBRows || B.dtype() != DType::BF16 || !packs(K, N) || pack_mode() == "off") return false;
  const Key key = packed_key(M, N, K, trans_b, beta, C.dtype(), trans_a);
  const Stopwatch timer;
  Tensor buf;
  int layout = -1;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    const dnnl::memory::desc chosen = entry_locked(c, key).b.get_desc();
    if (chosen == make_descs(0, M, N, K, trans_a, trans_b, DType::BF16).b) return false;  // already B's own layout
    layout = layout_index_locked(c, chosen);
    pack_locked(c, B, K, N, trans_b, layout, buf);
  }
  const double reorder_s = timer.seconds();
  MOE_ASSERT(run(c, key, A.raw(), buf.raw(), C.raw(), M, N, K, layout));
  std::lock_guard<std::mutex> lock(c.mu);  // the reorder is part of this product's time
  c.stats.seconds += reorder_s;
  entry_locked(c, key).seconds += reorder_s;
  return true;
}

}  // namespace gemm_detail

int64_t packed_weight_bytes(int64_t K, int64_t N, bool trans, int64_t m) {
  if (m <= 0 || !packs(K, N)) return 0;
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.mu);
  return static_cast<int64_t>(Allocator::round_size(packed_layout_locked(c, K, N, trans, m).get_size()));
}

void gemm_prepare_packed(int64_t M, int64_t N, int64_t K, bool trans_w, float beta, DType out) {
  if (M <= 0 || !packs(K, N)) return;
  Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(c.mu);
  entry_locked(c, packed_key(M, N, K, trans_w, beta, out));
}

}  // namespace moecore::kernels
