// cuDNN's fused attention built from backend-API descriptors (attention_cudnn_graph.h). The graphs are the ones
// cuDNN's runtime fusion engine recognizes as flash attention, in the form the cuDNN frontend's SDPA nodes lower to
// (cudnn-frontend include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, softmax.h and
// utils/attn_score_modifiers.h's causal mask): the same operations, data types and virtual tensors.
//
// Forward, per (b, h): S = Q·Kᵀ (f32) · scale; causal: S where row ≥ col else the mask value; M = rowmax S;
// E = exp(S − M); Z = rowsum E; stats = M + log Z (moecore's lse: natural log of the scaled scores); P = E / Z
// (bf16); O = P·V.
// Backward: Δ = rowsum(dO ⊙ O) (cuDNN's "softmax_sum", written to scratch); P = exp(mask(Q·Kᵀ·scale − stats));
// dV = Pᵀ·dO; dP = dO·Vᵀ; dS = P ⊙ (dP − Δ) · scale; dK = dSᵀ·Q; dQ = dS·K. Under GQA dK and dV come out per query
// head and are summed over each group by a reduction. dQ written by its matmul (no f32 dQ accumulator that kernels
// add into with atomics) is the frontend's deterministic form on Hopper; engines noted non-deterministic are skipped.
#include "moecore/kernels/cuda/attention_cudnn_graph.h"

#ifdef MOECORE_HAVE_CUDNN_HEADERS
#include <fmt/format.h>

#include <array>
#include <limits>
#include <stdexcept>
#include <vector>

#include "moecore/core/error.h"

namespace moecore::kernels::cuda {

namespace {

using SdpaDims4 = std::array<int64_t, 4>;

// A cuDNN call that failed while building a graph: build_sdpa_plan turns it into the fallback's reason.
struct CudnnGraphError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The non-virtual tensors' ids in the variant pack.
enum SdpaUid : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidScale,
  kUidMaskValue,
  kUidDout,
  kUidDq,
  kUidDk,
  kUidDv,
  kUidSoftmaxSum,
  kUidOne,
  kFirstVirtualUid = 1000,
};

// Owns every descriptor of one graph and its plan; builds them with each call checked.
class SdpaGraph {
 public:
  explicit SdpaGraph(const CudnnApi& api) : api_(api) {}
  SdpaGraph(const SdpaGraph&) = delete;
  SdpaGraph& operator=(const SdpaGraph&) = delete;
  ~SdpaGraph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) api_.DestroyDescriptor(*it);
  }

  void check(cudnnStatus_t st, const char* call) const {
    if (st != CUDNN_STATUS_SUCCESS) throw CudnnGraphError(cudnn_error_text(api_, call, st));
  }
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    check(api_.CreateDescriptor(type, &d), "cudnnBackendCreateDescriptor");
    owned_.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* values) const {
    check(api_.SetAttribute(d, name, type, count, values), "cudnnBackendSetAttribute");
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) const {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) const {
    const cudnnStatus_t st = api_.Finalize(d);
    if (st != CUDNN_STATUS_SUCCESS)
      throw CudnnGraphError(cudnn_error_text(api_, fmt::format("cudnnBackendFinalize({})", what).c_str(), st));
  }

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const SdpaDims4& dims, const SdpaDims4& strides,
                                  bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    const bool virt = is_virtual, value = by_value;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &value);
    finalize(t, "tensor");
    return t;
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const SdpaDims4& dims, const SdpaDims4& strides) {
    return tensor(next_virtual_++, dt, dims, strides, true);
  }
  // An f32 scalar passed by value at execution (the variant pack points at host memory).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]) computed in `prec`; axis: GEN_INDEX's dimension.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "pointwise");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.0f;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    finalize(op, "pointwise operation");
    ops_.push_back(op);
  }
  // c = a·b over the last two dims (batched over the first two; b's head dim broadcasts over a group of a's heads).
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(mm, "matmul");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    finalize(op, "matmul operation");
    ops_.push_back(op);
  }
  // y = reduce(x) over the dims where y is 1 (or, for the heads, groups of x's heads onto y's).
  void reduction(cudnnReduceTensorOp_t op_type, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op_type);
    finalize(rd, "reduction");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    finalize(op, "reduction operation");
    ops_.push_back(op);
  }
  // y: x's elements under new dims and strides (a transpose seen by the next matmul).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    finalize(op, "reshape operation");
    ops_.push_back(op);
  }

  // The operation graph of everything added, on `handle`.
  cudnnBackendDescriptor_t operation_graph(cudnnHandle_t handle) {
    cudnnBackendDescriptor_t g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data());
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    finalize(g, "operation graph");
    return g;
  }

  const CudnnApi& api() const { return api_; }

 private:
  const CudnnApi& api_;
  std::vector<cudnnBackendDescriptor_t> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtualUid;
};

// The dims and strides of moecore's [S, B, N, W] rows (row width `stride_w`, `w` channels used) seen as cuDNN's
// [B, N, S, W]; `transposed` swaps the last two ([B, N, W, S]: Kᵀ, Vᵀ).
SdpaDims4 sdpa_sbnd_dims(int64_t B, int64_t N, int64_t S, int64_t w, bool transposed = false) {
  return transposed ? SdpaDims4{B, N, w, S} : SdpaDims4{B, N, S, w};
}
SdpaDims4 sdpa_sbnd_strides(int64_t B, int64_t N, int64_t stride_w, bool transposed = false) {
  const int64_t row = B * N * stride_w;
  return transposed ? SdpaDims4{N * stride_w, stride_w, 1, row} : SdpaDims4{N * stride_w, stride_w, row, 1};
}

// The graph's shared shapes.
struct SdpaShapes {
  int64_t B, Nq, Nkv, S, D, Dv;
  SdpaDims4 scores() const { return {B, Nq, S, S}; }
  SdpaDims4 scores_strides() const { return {Nq * S * S, S * S, S, 1}; }
  SdpaDims4 scores_t_strides() const { return {Nq * S * S, S * S, 1, S}; }  // the same scores read transposed
  SdpaDims4 rows() const { return {B, Nq, S, 1}; }
  SdpaDims4 rows_strides() const { return {Nq * S, S, 1, 1}; }
};

// causal: x where row ≥ col, else the mask value (utils/attn_score_modifiers.h causal_mask).
cudnnBackendDescriptor_t sdpa_causal_mask(SdpaGraph& g, const SdpaShapes& sh, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t mask_value) {
  cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, sh.scores(), sh.scores_strides());
  cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, sh.scores(), sh.scores_strides());
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, sh.scores(), sh.scores_strides());
  cudnnBackendDescriptor_t y = g.virt(CUDNN_DATA_FLOAT, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, mask_value, keep, y);
  return y;
}

void build_sdpa_forward(SdpaGraph& g, const SdpaShapes& sh) {
  const auto bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const int64_t B = sh.B, Nq = sh.Nq, Nkv = sh.Nkv, S = sh.S, D = sh.D, Dv = sh.Dv;
  auto q = g.tensor(kUidQ, bf, sdpa_sbnd_dims(B, Nq, S, D), sdpa_sbnd_strides(B, Nq, D), false);
  auto kt = g.tensor(kUidK, bf, sdpa_sbnd_dims(B, Nkv, S, D, true), sdpa_sbnd_strides(B, Nkv, D, true), false);
  auto v = g.tensor(kUidV, bf, sdpa_sbnd_dims(B, Nkv, S, Dv), sdpa_sbnd_strides(B, Nkv, D), false);
  auto o = g.tensor(kUidO, bf, sdpa_sbnd_dims(B, Nq, S, Dv), sdpa_sbnd_strides(B, Nq, D), false);
  auto stats = g.tensor(kUidStats, f32, sh.rows(), sh.rows_strides(), false);
  auto scale = g.scalar(kUidScale), mask_value = g.scalar(kUidMaskValue);

  auto s = g.virt(f32, sh.scores(), sh.scores_strides());
  g.matmul(q, kt, s);
  auto s_scaled = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, s_scaled);
  auto s_masked = sdpa_causal_mask(g, sh, s_scaled, mask_value);
  // Softmax with its statistics (node/softmax.h).
  auto m = g.virt(f32, sh.rows(), sh.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s_masked, m);
  auto centered = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, s_masked, m, nullptr, centered);
  auto e = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, e);
  auto z = g.virt(f32, sh.rows(), sh.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto log_z = g.virt(f32, sh.rows(), sh.rows_strides());
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, m, log_z, nullptr, stats);
  auto p = g.virt(bf, sh.scores(), sh.scores_strides());  // P enters the second matmul in the operands' type
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, nullptr, p);
  g.matmul(p, v, o);
}

void build_sdpa_backward(SdpaGraph& g, const SdpaShapes& sh) {
  const auto bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const int64_t B = sh.B, Nq = sh.Nq, Nkv = sh.Nkv, S = sh.S, D = sh.D, Dv = sh.Dv;
  auto q = g.tensor(kUidQ, bf, sdpa_sbnd_dims(B, Nq, S, D), sdpa_sbnd_strides(B, Nq, D), false);
  auto kt = g.tensor(kUidK, bf, sdpa_sbnd_dims(B, Nkv, S, D, true), sdpa_sbnd_strides(B, Nkv, D, true), false);
  auto vt = g.tensor(kUidV, bf, sdpa_sbnd_dims(B, Nkv, S, Dv, true), sdpa_sbnd_strides(B, Nkv, D, true), false);
  auto o = g.tensor(kUidO, bf, sdpa_sbnd_dims(B, Nq, S, Dv), sdpa_sbnd_strides(B, Nq, D), false);
  auto dout = g.tensor(kUidDout, bf, sdpa_sbnd_dims(B, Nq, S, Dv), sdpa_sbnd_strides(B, Nq, D), false);
  auto stats = g.tensor(kUidStats, f32, sh.rows(), sh.rows_strides(), false);
  auto dq = g.tensor(kUidDq, bf, sdpa_sbnd_dims(B, Nq, S, D), sdpa_sbnd_strides(B, Nq, D), false);
  auto dk = g.tensor(kUidDk, bf, sdpa_sbnd_dims(B, Nkv, S, D), sdpa_sbnd_strides(B, Nkv, D), false);
  auto dv = g.tensor(kUidDv, bf, sdpa_sbnd_dims(B, Nkv, S, Dv), sdpa_sbnd_strides(B, Nkv, D), false);
  auto softmax_sum = g.tensor(kUidSoftmaxSum, f32, sh.rows(), sh.rows_strides(), false);
  auto scale = g.scalar(kUidScale), mask_value = g.scalar(kUidMaskValue), one = g.scalar(kUidOne);

  // Δ = rowsum(dO ⊙ O) (times the inverse dropout scale, 1 here).
  auto dout_o = g.virt(f32, {B, Nq, S, Dv}, {Nq * S * Dv, S * Dv, Dv, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, dout_o);
  auto delta = g.virt(f32, sh.rows(), sh.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_o, delta);
  g.pointwise(CUDNN_POINTWISE_MUL, delta, one, nullptr, softmax_sum);

  // P = exp(mask(Q·Kᵀ·scale − stats)).
  auto s = g.virt(f32, sh.scores(), sh.scores_strides());
  g.matmul(q, kt, s);
  auto s_scaled = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, s_scaled);
  auto s_centered = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, s_scaled, stats, nullptr, s_centered);
  auto s_masked = sdpa_causal_mask(g, sh, s_centered, mask_value);
  auto p = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_EXP, s_masked, nullptr, nullptr, p);

  // dV = Pᵀ·dO, per query head and then summed over each group under GQA.
  auto pt = g.virt(bf, {B, Nq, S, S}, sh.scores_t_strides());
  g.reshape(p, pt);
  if (Nq == Nkv) {
    g.matmul(pt, dout, dv);
  } else {
    auto dv_heads = g.virt(bf, {B, Nq, S, Dv}, {Nq * S * Dv, S * Dv, Dv, 1});
    g.matmul(pt, dout, dv_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
  }

  // dS = P ⊙ (dO·Vᵀ − Δ) · scale.
  auto dp = g.virt(f32, sh.scores(), sh.scores_strides());
  g.matmul(dout, vt, dp);
  auto dp_centered = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp_centered);
  auto ds_unscaled = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, p, nullptr, ds_unscaled);
  auto ds = g.virt(f32, sh.scores(), sh.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, nullptr, ds);

  // dK = dSᵀ·Q (summed over each group under GQA).
  auto dst = g.virt(bf, {B, Nq, S, S}, sh.scores_t_strides());
  g.reshape(ds, dst);
  if (Nq == Nkv) {
    g.matmul(dst, q, dk);
  } else {
    auto dk_heads = g.virt(bf, {B, Nq, S, D}, {Nq * S * D, S * D, D, 1});
    g.matmul(dst, q, dk_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
  }

  // dQ = dS·K, written by the matmul itself: the deterministic form.
  auto k = g.virt(bf, sdpa_sbnd_dims(B, Nkv, S, D), sdpa_sbnd_strides(B, Nkv, D));
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
}

}  // namespace

struct SdpaPlan {
  explicit SdpaPlan(const CudnnApi& api) : graph(api) {}
  SdpaGraph graph;
  cudnnBackendDescriptor_t plan = nullptr;
  SdpaKey key;
  int64_t workspace = 0;
  int64_t engine = -1;
  float mask_value = 0;
};

void SdpaPlanDeleter::operator()(SdpaPlan* p) const {
  delete p;
}

namespace {

// Whether an engine config's engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC.
bool sdpa_engine_nondeterministic(SdpaGraph& g, cudnnBackendDescriptor_t cfg, int64_t* engine_index) {
  cudnnBackendDescriptor_t engine = g.create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  g.check(g.api().GetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine),
          "cudnnBackendGetAttribute(ENGINECFG_ENGINE)");
  g.check(g.api().GetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, engine_index),
          "cudnnBackendGetAttribute(ENGINE_GLOBAL_INDEX)");
  std::array<cudnnBackendNumericalNote_t, 32> notes{};
  g.check(g.api().GetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &n, notes.data()),
          "cudnnBackendGetAttribute(ENGINE_NUMERICAL_NOTE)");
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(notes.size()); i++)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

// The first deterministic engine config of `mode`'s ranking that finalizes into a plan; false when none does
// (`tried` collects what each refused).
bool sdpa_plan_from_heuristics(SdpaPlan& p, cudnnHandle_t handle, cudnnBackendDescriptor_t op_graph,
                               cudnnBackendHeurMode_t mode, std::string* tried) {
  SdpaGraph& g = p.graph;
  cudnnBackendDescriptor_t heur = g.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  g.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph);
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  g.finalize(heur, "engine heuristics");
  int64_t count = 0;
  g.check(g.api().GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS count)");
  if (count <= 0) return false;
  std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
  for (auto& c : cfgs) c = g.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t got = 0;
  g.check(g.api().GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               cfgs.data()),
          "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
  for (int64_t i = 0; i < got && i < count; i++) {
    int64_t engine = -1;
    if (sdpa_engine_nondeterministic(g, cfgs[i], &engine)) {
      *tried += fmt::format("{}engine {}: non-deterministic", tried->empty() ? "" : "; ", engine);
      continue;
    }
    cudnnBackendDescriptor_t plan = g.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    g.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    g.set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i]);
    const cudnnStatus_t st = g.api().Finalize(plan);
    if (st != CUDNN_STATUS_SUCCESS) {
      *tried +=
          fmt::format("{}engine {}: {}", tried->empty() ? "" : "; ", engine, cudnn_error_text(g.api(), "plan", st));
      continue;
    }
    int64_t n = 0;
    g.check(g.api().GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &p.workspace),
            "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)");
    p.plan = plan;
    p.engine = engine;
    return true;
  }
  return false;
}

}  // namespace

SdpaPlanPtr build_sdpa_plan(const CudnnApi& api, cudnnHandle_t handle, const SdpaKey& key, std::string* why) {
  MOE_ASSERT(key.causal && key.bf16 && key.Dv <= key.D && key.Nq % key.Nkv == 0);
  SdpaPlanPtr p(new SdpaPlan(api));
  p->key = key;
  // Masked scores: −inf from cuDNN 9.10, float's lowest before (the frontend's get_negative_inf_value: older
  // engines' softmax wanted a finite value).
  p->mask_value = api.version >= 91000 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::lowest();
  const SdpaShapes sh{key.B, key.Nq, key.Nkv, key.S, key.D, key.Dv};
  try {
    if (key.backward)
      build_sdpa_backward(p->graph, sh);
    else
      build_sdpa_forward(p->graph, sh);
    cudnnBackendDescriptor_t op_graph = p->graph.operation_graph(handle);
    std::string tried;
    if (sdpa_plan_from_heuristics(*p, handle, op_graph, CUDNN_HEUR_MODE_A, &tried) ||
        sdpa_plan_from_heuristics(*p, handle, op_graph, CUDNN_HEUR_MODE_FALLBACK, &tried))
      return p;
    if (why)
      *why = tried.empty() ? "cuDNN's heuristics offer no engine for the graph"
                           : fmt::format("no deterministic engine runs the graph ({})", tried);
  } catch (const CudnnGraphError& e) {
    if (why) *why = e.what();
  }
  return nullptr;
}

bool sdpa_graph_operations_finalize(const CudnnApi& api, const SdpaKey& key, std::string* why) {
  SdpaGraph g(api);
  const SdpaShapes sh{key.B, key.Nq, key.Nkv, key.S, key.D, key.Dv};
  try {
    if (key.backward)
      build_sdpa_backward(g, sh);
    else
      build_sdpa_forward(g, sh);
  } catch (const CudnnGraphError& e) {
    if (why) *why = e.what();
    return false;
  }
  return true;
}

int64_t sdpa_plan_workspace_bytes(const SdpaPlan& plan) {
  return plan.workspace;
}
int64_t sdpa_plan_engine(const SdpaPlan& plan) {
  return plan.engine;
}

void run_sdpa_plan(const CudnnApi& api, cudnnHandle_t handle, const SdpaPlan& plan, const SdpaBuffers& buf,
                   void* workspace) {
  // By-value scalars are read from host memory when the plan is launched.
  const float scale = buf.scale, mask_value = plan.mask_value, one = 1.0f;
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  auto add = [&](int64_t uid, const void* ptr) {
    MOE_ASSERT_MSG(ptr, "cuDNN attention buffer {} missing", uid);
    uids.push_back(uid);
    ptrs.push_back(const_cast<void*>(ptr));
  };
  add(kUidQ, buf.q), add(kUidK, buf.k), add(kUidV, buf.v), add(kUidO, buf.o), add(kUidStats, buf.stats);
  add(kUidScale, &scale), add(kUidMaskValue, &mask_value);
  if (plan.key.backward) {
    add(kUidDout, buf.dout), add(kUidDq, buf.dq), add(kUidDk, buf.dk), add(kUidDv, buf.dv);
    add(kUidSoftmaxSum, buf.softmax_sum), add(kUidOne, &one);
  }
  cudnnBackendDescriptor_t pack = nullptr;
  auto check = [&](cudnnStatus_t st, const char* call) {
    if (st == CUDNN_STATUS_SUCCESS) return;
    const std::string msg = cudnn_error_text(api, call, st);
    if (pack) api.DestroyDescriptor(pack);
    MOE_CHECK(false, "cuDNN attention ({}): {}", plan.key.str(), msg);
  };
  check(api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "cudnnBackendCreateDescriptor");
  check(api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
                         uids.data()),
        "cudnnBackendSetAttribute(VARIANT_PACK_UNIQUE_IDS)");
  check(api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                         static_cast<int64_t>(ptrs.size()), ptrs.data()),
        "cudnnBackendSetAttribute(VARIANT_PACK_DATA_POINTERS)");
  check(api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
        "cudnnBackendSetAttribute(VARIANT_PACK_WORKSPACE)");
  check(api.Finalize(pack), "cudnnBackendFinalize(variant pack)");
  check(api.Execute(handle, plan.plan, pack), "cudnnBackendExecute");
  api.DestroyDescriptor(pack);
}

}  // namespace moecore::kernels::cuda
#endif
