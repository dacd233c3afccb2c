// The router's ops on the GPU (kernels/routing.h, RouterKernels): operand checks, scratch from the caching allocator,
// then the launchers of launch_routing.h (routing.cu's kernels) on the current stream: f32 tensors, I32 ids, f64 counts
// and sums, all on one GPU. router_rows is one fused kernel (scores, top-k, probabilities
// and, in training, the aux scores with their top-k, the entropy and the logsumexp), capacity one block per expert.
// Nothing here copies to the host.
#include <limits>

#include "moecore/core/error.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/launch_routing.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using detail::check_launch;
using moecore::device::current_stream;

namespace {

// An optional f32 operand: null when undefined.
float* f32_or_null(const Tensor& t, const char* name) {
  return t.defined() ? detail::f32(t, name) : nullptr;
}

// I32 ids or f64 counts on the GPU.
template <typename V>
V* on_gpu(const Tensor& t, const char* name) {
  if (!t.defined()) return nullptr;
  MOE_ASSERT_MSG(t.device().is_cuda(), "{} is on {}, but the router kernel runs on the GPU", name, t.device().str());
  return t.device_data<V>();
}

}  // namespace

// f64 router dtype: refused with the flag's name (the GPU router computes in f32).
void router_check_backend(DType router_dtype) {
  MOE_CHECK(router_dtype == DType::F32,
            "--moe-router-dtype fp64 is not supported by moecore on the GPU (the GPU router computes in f32; "
            "route in fp64 on the CPU)");
}

void router_rows(const RouterRule& rule, RouterRows& r) {
  const int64_t T = r.used_TE.dim(0), E = r.used_TE.dim(1), K = rule.K;
  MOE_CHECK(T * K < std::numeric_limits<int32_t>::max() && T * E < std::numeric_limits<int32_t>::max(),
            "the GPU router indexes assignments with I32: {} tokens × {} experts is too many", T, E);
  MOE_ASSERT(!r.sinkhorn_TE.defined() || (r.sinkhorn_TE.numel() == T * E && r.sinkhorn_TE.dtype() == DType::F64));
  MOE_ASSERT(r.scores_TE.defined() == (rule.sigmoid || rule.pre_softmax));
  MOE_ASSERT(!r.aux_top_TK.defined() || r.aux_scores_TE.defined());
  MOE_ASSERT(r.lse_T.defined() == r.logits_TE.defined());
  const Device d = r.used_TE.device();
  const cudaStream_t s = current_stream();
  launch::RouterRowArgs a;
  a.T = T;
  a.E = E;
  a.K = K;
  a.sigmoid = rule.sigmoid;
  a.pre_softmax = rule.pre_softmax;
  a.num_groups = rule.num_groups;
  a.group_topk = rule.group_topk;
  a.scale = static_cast<float>(rule.scale);
  a.used = detail::f32(r.used_TE, "used_TE");
  a.bias = f32_or_null(r.bias_E, "bias_E");
  a.sinkhorn = on_gpu<double>(r.sinkhorn_TE, "sinkhorn_TE");
  a.scores = f32_or_null(r.scores_TE, "scores_TE");
  a.idx = on_gpu<int32_t>(r.idx_TK, "idx_TK");
  a.p = detail::f32(r.p_TK, "p_TK");
  a.probs = detail::f32(r.probs_TK, "probs_TK");
  a.kept = on_gpu<int32_t>(r.kept_TK, "kept_TK");
  Tensor group_scores, group_sel, entropy_T, lse_sq_T;
  if (rule.group_topk > 0) {
    group_scores = Tensor::empty({T, rule.num_groups}, DType::F32, d);
    group_sel = Tensor::empty({T, rule.num_groups}, DType::I32, d);
    a.group_scores = group_scores.device_data<float>();
    a.group_sel = group_sel.device_data<int32_t>();
  }
  if (r.aux_scores_TE.defined()) {
    entropy_T = Tensor::empty({T}, DType::F64, d);
    a.aux_scores = detail::f32(r.aux_scores_TE, "aux_scores_TE");
    a.aux_top = on_gpu<int32_t>(r.aux_top_TK, "aux_top_TK");
    a.entropy_T = entropy_T.device_data<double>();
  }
  if (r.lse_T.defined()) {
    lse_sq_T = Tensor::empty({T}, DType::F64, d);
    a.logits = detail::f32(r.logits_TE, "logits_TE");
    a.lse = detail::f32(r.lse_T, "lse_T");
    a.lse_sq_T = lse_sq_T.device_data<double>();
  }
  launch::router_rows(a, s);
  check_launch("router_rows");
  if (!r.sums_2.defined()) return;
  MOE_ASSERT(r.sums_2.numel() == 2);
  r.sums_2.zero_();
  double* sums = on_gpu<double>(r.sums_2, "sums_2");
  if (entropy_T.defined()) launch::router_sum_f64(entropy_T.device_data<double>(), T, sums, s);
  if (lse_sq_T.defined()) launch::router_sum_f64(lse_sq_T.device_data<double>(), T, sums + 1, s);
  check_launch("router_sum_f64");
}

void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad) {
  const int64_t T = idx_TK.dim(0), K = idx_TK.dim(1);
  const Device d = idx_TK.device();
  Tensor list = Tensor::empty({E, T}, DType::I32, d), work = Tensor::empty({E, T}, DType::I32, d);
  launch::router_capacity(on_gpu<int32_t>(idx_TK, "idx_TK"), detail::f32(probs_TK, "probs_TK"),
                          on_gpu<int32_t>(kept_TK, "kept_TK"), T, E, K, C, by_position, pad,
                          list.device_data<int32_t>(), work.device_data<int32_t>(), current_stream());
  check_launch("router_capacity");
}

void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK) {
  const int64_t n = idx_TK.numel();
  MOE_ASSERT(kept_TK.numel() == n && ids_TK.numel() == n);
  launch::router_mask_ids(on_gpu<int32_t>(idx_TK, "idx_TK"), on_gpu<int32_t>(kept_TK, "kept_TK"),
                          on_gpu<int32_t>(ids_TK, "ids_TK"), n, current_stream());
  check_launch("router_mask_ids");
}

void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E) {
  launch::router_expert_counts(on_gpu<int32_t>(ids_TK, "ids_TK"), ids_TK.numel(), counts_E.numel(),
                               on_gpu<double>(counts_E, "counts_E"), current_stream());
  check_launch("router_expert_counts");
}

void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(top_TK.dim(0) == T && G >= 1 && cnt_GE.numel() == G * E && agg_GE.numel() == G * E);
  launch::router_aux_counts(detail::f32(a_TE, "a_TE"), on_gpu<int32_t>(top_TK, "top_TK"), T, E, K, G,
                            on_gpu<double>(cnt_GE, "cnt_GE"), on_gpu<double>(agg_GE, "agg_GE"), current_stream());
  check_launch("router_aux_counts");
}

void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE) {
  const int64_t T = da_TE.dim(0), E = da_TE.dim(1), G = coef_GE.numel() / E;
  MOE_ASSERT(G >= 1 && coef_GE.numel() == G * E);
  launch::router_add_class_coef(detail::f32(da_TE, "da_TE"), detail::f32(coef_GE, "coef_GE"), T, E, G,
                                current_stream());
  check_launch("router_add_class_coef");
}

void router_mul_(Tensor& a, const Tensor& u) {
  MOE_ASSERT(a.numel() == u.numel());
  launch::router_mul(detail::f32(a, "a"), detail::f32(u, "u"), a.numel(), current_stream());
  check_launch("router_mul");
}

void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE) {
  const int64_t T = dl_TE.dim(0), E = dl_TE.dim(1), K = rule.K;
  MOE_ASSERT(dprobs_TK.numel() == T * K && idx_TK.numel() == T * K && kept_TK.numel() == T * K);
  launch::router_score_backward(detail::f32(dprobs_TK, "dprobs_TK"), on_gpu<int32_t>(idx_TK, "idx_TK"),
                                on_gpu<int32_t>(kept_TK, "kept_TK"), detail::f32(p_TK, "p_TK"),
                                f32_or_null(scores_TE, "scores_TE"), rule.sigmoid, rule.pre_softmax,
                                static_cast<float>(rule.scale), T, E, K, detail::f32(dl_TE, "dl_TE"), current_stream());
  check_launch("router_score_backward");
}

void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE) {
  const int64_t T = dl_TE.dim(0), E = dl_TE.dim(1);
  MOE_ASSERT(used_TE.numel() == T * E && a_TE.numel() == T * E && da_TE.numel() == T * E);
  launch::router_aux_score_backward(sigmoid, detail::f32(used_TE, "used_TE"), detail::f32(a_TE, "a_TE"),
                                    detail::f32(da_TE, "da_TE"), detail::f32(dl_TE, "dl_TE"), T, E,
                                    static_cast<float>(scale), current_stream());
  check_launch("router_aux_score_backward");
}

void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE) {
  const int64_t T = logits_TE.dim(0), E = logits_TE.dim(1);
  MOE_ASSERT(dl_TE.numel() == T * E && lse_T.numel() == T);
  launch::router_z_loss_backward(detail::f32(logits_TE, "logits_TE"), detail::f32(lse_T, "lse_T"),
                                 static_cast<float>(f), T, E, detail::f32(dl_TE, "dl_TE"), current_stream());
  check_launch("router_z_loss_backward");
}

const RouterKernels kRouterKernels{router_check_backend,      router_rows,           router_capacity,
                                   router_mask_ids,           router_expert_counts,  router_aux_counts,
                                   router_add_class_coef,     router_mul_,           router_score_backward,
                                   router_aux_score_backward, router_z_loss_backward};

}  // namespace moecore::kernels::cuda
