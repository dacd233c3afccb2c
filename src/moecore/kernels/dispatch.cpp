// The one place each op picks its backend: every op family's backend table (kernels/backends.h) for tensors on a
// device, which the API's entry points (kernels/*.h) call: this file's (the router's and the attention's),
// dispatch_tensor.cpp's, dispatch_layers.cpp's, moe_permute.cpp's, grad_clip.cpp's and id_checks.cpp's. Tensors in
// host memory go to the CPU's table, tensors on a GPU to the GPU's; a CPU-only build has no GPU tables, and a GPU
// tensor, which no correct caller has there, gets the build's message here. Each backend checks its own operands;
// what the entry points do besides the choice is the level-2 timer scope some ops open around either backend. Ops with
// only a CPU kernel are not listed (kernels/cpu defines them under their API names).
#include "moecore/kernels/dispatch.h"

#include "moecore/device/runtime.h"
#include "moecore/kernels/backend.h"

namespace moecore::kernels {

// backend.h: the CPU's kernels (oneDNN, the FlashNative attention, the fused loss) and the GPU's.
const BackendOffers& backend_offers(Device d) {
  static const BackendOffers cpu_offers{.gemm_bf16_output = true,
                                        .attention_bf16_tensors = true,
                                        .fused_loss_backward = true,
                                        .lazy_grad_zero = true,
                                        .update_writes_bf16_copy = true,
                                        .norm_on_host = true};
  static const BackendOffers cuda_offers{};
  return d.is_cuda() ? cuda_offers : cpu_offers;
}

namespace {
// The GPU's table, or the build's message where it has none.
template <typename Table>
const Table& gpu_table(const Table* cuda_table, const char* op) {
  if (!cuda_table) moecore::device::no_cuda_kernel(op);
  return *cuda_table;
}
// The backend table for tensors on `d`: the CPU's, or the GPU's where the build has one.
template <typename Table>
const Table& backend_for(Device d, const Table& cpu_table, const Table* cuda_table, const char* op) {
  return d.is_cuda() ? gpu_table(cuda_table, op) : cpu_table;
}
// The GPU's table, or null where the build has none; MOECORE_TABLES: a family's CPU table and that, by one name.
#ifdef MOECORE_HAVE_CUDA
#define MOECORE_CUDA_TABLE(Table, name) (&cuda::name)
#else
#define MOECORE_CUDA_TABLE(Table, name) (static_cast<const Table*>(nullptr))
#endif
#define MOECORE_TABLES(name) cpu::name, MOECORE_CUDA_TABLE(decltype(cpu::name), name)
}  // namespace

// dispatch.h
const RouterKernels& router_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kRouterKernels), "router");
}
const AttentionKernels& attention_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kAttentionKernels), "attention");
}
const GemmKernels& gemm_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kGemmKernels), "gemm");
}
const ElementwiseKernels& elementwise_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kElementwiseKernels), "elementwise");
}
const NormKernels& norms_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kNormKernels), "norm");
}
const RopeKernels& rope_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kRopeKernels), "rope");
}
const ActivationKernels& activation_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kActivationKernels), "activation");
}
const EmbeddingKernels& embedding_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kEmbeddingKernels), "embedding");
}
const CrossEntropyKernels& cross_entropy_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kCrossEntropyKernels), "cross_entropy");
}
const OptimizerKernels& optimizer_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kOptimizerKernels), "optimizer update");
}
const DropoutKernels& dropout_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kDropoutKernels), "dropout");
}
const PositionRowsKernels& position_rows_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kPositionRowsKernels), "position rows");
}
const MlaBlockKernels& mla_blocks_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kMlaBlockKernels), "mla_move_block");
}
const SharedGateKernels& shared_gate_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kSharedGateKernels), "shared gate");
}
const MoePermuteKernels& moe_permute_on(Device d) {
  return backend_for(d, MOECORE_TABLES(kMoePermuteKernels), "moe permutation");
}
const ClipKernels& clip_on_gpu() {
  return gpu_table(MOECORE_CUDA_TABLE(ClipKernels, kClipKernels), "gradient clip");
}
const IdCheckKernels* id_checks_on_gpu() {
  return MOECORE_CUDA_TABLE(IdCheckKernels, kIdCheckKernels);
}

// router.h: the backend of the router's tensors.
void router_check_backend(Device device, DType router_dtype) {
  router_on(device).check_backend(router_dtype);
}
void router_rows(const RouterRule& rule, RouterRows& r) {
  router_on(r.used_TE.device()).rows(rule, r);
}
void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad) {
  router_on(idx_TK.device()).capacity(idx_TK, probs_TK, kept_TK, E, C, by_position, pad);
}
void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK) {
  router_on(idx_TK.device()).mask_ids(idx_TK, kept_TK, ids_TK);
}
void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E) {
  router_on(ids_TK.device()).expert_counts(ids_TK, counts_E);
}
void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE) {
  router_on(a_TE.device()).aux_counts(a_TE, top_TK, G, cnt_GE, agg_GE);
}
void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE) {
  router_on(da_TE.device()).add_class_coef(da_TE, coef_GE);
}
void router_mul_(Tensor& a, const Tensor& u) {
  router_on(a.device()).mul_(a, u);
}
void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE) {
  router_on(dl_TE.device()).score_backward(rule, dprobs_TK, idx_TK, kept_TK, p_TK, scores_TE, dl_TE);
}
void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE) {
  router_on(dl_TE.device()).aux_score_backward(sigmoid, used_TE, a_TE, da_TE, scale, dl_TE);
}
void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE) {
  router_on(dl_TE.device()).z_loss_backward(logits_TE, lse_T, f, dl_TE);
}

// attention.h: the backend of the queries (of o for the merge).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout) {
  attention_on(q.device()).forward(q, k, v, scale, o, lse, dropout);
}
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout) {
  attention_on(q.device()).backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
}
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim) {
  attention_on(q.device()).forward_bf16(q, k, v, scale, o, lse, dropout, rope, value_dim);
}
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim) {
  attention_on(q.device()).backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, rope, value_dim);
}
void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                             Tensor& o, Tensor& lse, const AttentionDropout* dropout, bool round_bf16) {
  attention_on(q.device()).block_forward(q, k, v, q0, k0, scale, o, lse, dropout, round_bf16);
}
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part) {
  attention_on(o.device()).merge(o, lse, o_part, lse_part);
}
void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk,
                              Tensor& dv, const AttentionDropout* dropout, bool round_bf16) {
  attention_on(q.device()).block_backward(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dropout, round_bf16);
}

}  // namespace moecore::kernels
