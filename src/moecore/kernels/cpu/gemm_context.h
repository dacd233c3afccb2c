// The GEMM context gemm.cpp and gemm_packed.cpp share (internal to kernels/cpu): the primitive cache keyed by
// shape, the blocked weight layouts and their packers, and the call that runs a cached primitive.
#pragma once

#include <cstdint>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "moecore/kernels/gemm.h"

namespace moecore::kernels::gemm_detail {

struct Key {
  int64_t batch;  // 0 for a plain 2-D product
  int64_t m, n, k;
  int64_t lda, ldb;  // row strides of the stored A and B when they are column blocks of wider matrices; 0: dense
  bool ta, tb;
  DType dt;
  uint32_t alpha_bits, beta_bits;
  DType ct = DType::F32;  // C's dtype: f32, or bf16 (beta 0)
  bool packed = false;    // B in the blocked layout oneDNN chooses (PackedWeight), not the strided plain one
  bool operator==(const Key& o) const = default;
};

// Field by field: the struct has padding, whose bytes are indeterminate.
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t v : {uint64_t(k.batch), uint64_t(k.m), uint64_t(k.n), uint64_t(k.k), uint64_t(k.lda), uint64_t(k.ldb),
                       uint64_t(k.ta), uint64_t(k.tb), uint64_t(k.dt), uint64_t(k.alpha_bits), uint64_t(k.beta_bits),
                       uint64_t(k.ct), uint64_t(k.packed)})
      h = (h ^ v) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  dnnl::memory scratch;  // the primitive's scratchpad, pointed at Ctx::scratch at each call (none: 0 bytes)
  int64_t calls = 0;     // this primitive's share of GemmStats (gemm_shape_stats)
  double flops = 0, seconds = 0;
};

// Copies a plain op(W) [K, N] into one blocked layout (PackedWeight).
struct Packer {
  int64_t k, n;
  bool trans;
  int layout;
  dnnl::reorder prim;
  dnnl::memory src, dst, scratch;
};

// oneDNN's scratchpad (its copies of operands in its kernels' layouts). Left to oneDNN, it is allocated by oneDNN
// and given back as primitives come and go (bench train faulted ~540 fresh pages in per step). The primitives here
// take a user scratchpad instead: one buffer that grows to the largest any of them asks for (2.7 MiB for bench
// train) and is kept. Calls hold Ctx::mu, so one buffer serves them all.
class Scratchpad {
 public:
  Scratchpad() = default;
  Scratchpad(const Scratchpad&) = delete;
  Scratchpad& operator=(const Scratchpad&) = delete;
  ~Scratchpad();
  void* get(size_t bytes);  // at least `bytes`, page-aligned; valid until the next larger request
  size_t capacity() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Caps oneDNN's instruction set at max_cpu_isa() (core/cpu.h); oneDNN takes a cap only before its first primitive,
// so it is Ctx's first member.
bool cap_onednn_isa();

struct Ctx {
  bool isa_capped = cap_onednn_isa();
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::mutex mu;
  std::unordered_map<Key, Entry, KeyHash> cache;
  std::vector<dnnl::memory::desc> layouts;  // the blocked weight layouts met (PackedWeight::layout indexes it)
  std::vector<Packer> packers;
  Scratchpad scratch;
  // Where this CPU has no bf16 matmul: the widened f32 operand blocks of bf16 products (gemm_widened), a buffer of
  // its own (those products call oneDNN, whose scratchpad is the one above), used under widened_mu.
  Scratchpad widened;
  std::mutex widened_mu;
  GemmStats stats;
  Ctx();
};

Ctx& ctx();
// Binds `scratch` (the unbound scratchpad memory of a primitive created with scratchpad_mode::user) to the shared
// buffer, grown to fit, and adds it to `args`; c.mu held.
void bind_scratchpad(Ctx& c, dnnl::memory& scratch, std::unordered_map<int, dnnl::memory>& args);
uint32_t bits(float f);
dnnl::memory::data_type dnnl_dt(DType t);

// Reductions at least this long run in chunks of about kReductionChunk (see gemm_impl).
constexpr int64_t kLongReduction = 16384, kReductionChunk = 4096;

struct Descs {
  dnnl::memory::desc a, b, c;
};
// Memory descriptors for A [M,K] (or its transpose), B [K,N] (or transpose), C [M,N] of `cdtype`, each preceded by
// a batch dimension when batch > 0. Strides express the transposes, so no operand is ever copied; lda/ldb (2-D
// only), when non-zero, are the row strides of A and B as stored.
Descs make_descs(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype, int64_t lda = 0,
                 int64_t ldb = 0, DType cdtype = DType::F32);
// The cached primitive of `key`, created on first use; c.mu held.
Entry& entry_locked(Ctx& c, const Key& key);
// Executes one cached primitive on raw operand pointers. With b_layout (a packed B: its index in c.layouts), runs
// only where the primitive reads B in that layout, and says whether it ran.
bool run(Ctx& c, const Key& key, const void* A, const void* B, void* C, int64_t M, int64_t N, int64_t K,
         int b_layout = -1);

// Products of at least this many rows reorder B first into the layout oneDNN chooses, unless that is B's own: the
// reorder is K·N work against the product's M·K·N, and the product then runs faster in oneDNN's own layout
// (docs/performance.md, "Figures from code comments").
constexpr int64_t kPackedBRows = 8192;
// C = op(A)·op(B) (+ beta·C) that way, bf16 operands: false (nothing run) where it does not apply.
bool run_with_packed_b(Ctx& c, const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float beta,
                       int64_t M, int64_t N, int64_t K);

}  // namespace moecore::kernels::gemm_detail
