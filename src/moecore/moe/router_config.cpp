// The router's configuration: Megatron flag values parsed into enums, the validation that runs before anything is
// allocated, and the capacity formula (see router.h). No routing happens here.
#include <cmath>
#include <limits>

#include "moecore/moe/router.h"

namespace moecore::moe {

ScoreFunction parse_score_function(const std::string& s) {
  if (s == "softmax") return ScoreFunction::Softmax;
  if (s == "sigmoid") return ScoreFunction::Sigmoid;
  MOE_CHECK(false, "--moe-router-score-function {} is not supported; choose softmax or sigmoid", s);
  return ScoreFunction::Softmax;
}

LoadBalancingType parse_load_balancing_type(const std::string& s) {
  if (s == "aux_loss") return LoadBalancingType::AuxLoss;
  if (s == "seq_aux_loss") return LoadBalancingType::SeqAuxLoss;
  if (s == "global_aux_loss") return LoadBalancingType::GlobalAuxLoss;
  if (s == "sinkhorn") return LoadBalancingType::Sinkhorn;
  if (s == "none") return LoadBalancingType::None;
  MOE_CHECK(false,
            "--moe-router-load-balancing-type {} is not supported; choose from aux_loss, seq_aux_loss, "
            "global_aux_loss, sinkhorn, none (quantile_balancing is not supported by moecore)",
            s);
  return LoadBalancingType::None;
}

DropPolicy parse_drop_policy(const std::string& s) {
  if (s == "probs") return DropPolicy::Probs;
  if (s == "position") return DropPolicy::Position;
  MOE_CHECK(false, "--moe-token-drop-policy {} is not supported; choose probs or position", s);
  return DropPolicy::Probs;
}

const char* load_balancing_name(LoadBalancingType t) {
  switch (t) {
    case LoadBalancingType::AuxLoss:
      return "load_balancing_loss";
    case LoadBalancingType::SeqAuxLoss:
      return "seq_load_balancing_loss";
    case LoadBalancingType::GlobalAuxLoss:
      return "global_load_balancing_loss";
    case LoadBalancingType::Sinkhorn:
      return "sinkhorn";
    case LoadBalancingType::None:
      return "none";
  }
  return "?";
}

bool routes_by_sinkhorn(const RouterConfig& c) {
  return c.load_balancing.size() == 1 && c.load_balancing[0] == LoadBalancingType::Sinkhorn;
}

void validate(const RouterConfig& c) {
  for (auto t : c.load_balancing)
    MOE_CHECK(t != LoadBalancingType::Sinkhorn || c.load_balancing.size() == 1,
              "--moe-router-load-balancing-type sinkhorn routes on its own: list no other type with it");
  if (routes_by_sinkhorn(c)) {
    MOE_CHECK(c.aux_loss_coeff[0] == 0, "Sinkhorn routing does not support aux loss: pass --moe-aux-loss-coeff 0");
    // Megatron's sinkhorn path takes none of these into account; refused rather than ignored.
    MOE_CHECK(c.group_topk == 0 && !c.enable_expert_bias && c.topk_scaling_factor == 0,
              "--moe-router-load-balancing-type sinkhorn ignores --moe-router-group-topk, "
              "--moe-router-enable-expert-bias and --moe-router-topk-scaling-factor in Megatron; drop them");
  }
  MOE_CHECK(c.num_experts > 0, "--num-experts must be positive, got {}", c.num_experts);
  MOE_CHECK(c.num_experts <= std::numeric_limits<int32_t>::max(),
            "--num-experts {} is too large: expert ids are 32-bit, so at most {} experts", c.num_experts,
            std::numeric_limits<int32_t>::max());
  MOE_CHECK(c.topk >= 1 && c.topk <= c.num_experts, "--moe-router-topk {} must be in [1, --num-experts={}]", c.topk,
            c.num_experts);
  MOE_CHECK(routes_by_sinkhorn(c) || !(c.topk == 1 && c.score_function == ScoreFunction::Softmax && !c.pre_softmax),
            "--moe-router-topk 1 with the softmax score function needs --moe-router-pre-softmax (a softmax over one "
            "selected logit is constant, so the router would get no gradient)");
  MOE_CHECK(c.router_dtype == DType::F32 || c.router_dtype == DType::F64, "--moe-router-dtype must be fp32 or fp64");
  // As in Megatron, group-limited routing is on when --moe-router-group-topk is set; --moe-router-num-groups alone
  // routes over all experts. Each group scores the sum of its top (topk // group_topk) experts, which need not
  // divide evenly (topk 4 over 3 groups: each group scores its best one).
  if (c.group_topk > 0) {
    MOE_CHECK(c.num_groups > 0, "--moe-router-group-topk {} needs --moe-router-num-groups (the groups to choose from)",
              c.group_topk);
    MOE_CHECK(c.num_experts % c.num_groups == 0, "--num-experts {} must be divisible by --moe-router-num-groups {}",
              c.num_experts, c.num_groups);
    MOE_CHECK(c.group_topk <= c.num_groups, "--moe-router-group-topk {} exceeds --moe-router-num-groups {}",
              c.group_topk, c.num_groups);
    // Megatron would pick -inf scores (experts outside the chosen groups) here; refused instead.
    MOE_CHECK(c.topk <= c.group_topk * (c.num_experts / c.num_groups),
              "--moe-router-topk {} exceeds the {} experts of the --moe-router-group-topk {} chosen groups ({} experts "
              "per group): raise --moe-router-group-topk or lower --moe-router-topk",
              c.topk, c.group_topk * (c.num_experts / c.num_groups), c.group_topk, c.num_experts / c.num_groups);
  }
  MOE_CHECK(!c.enable_expert_bias || c.score_function == ScoreFunction::Sigmoid,
            "--moe-router-enable-expert-bias requires --moe-router-score-function sigmoid");
  MOE_CHECK(c.bias_update_rate >= 0, "--moe-router-bias-update-rate must be >= 0, got {}", c.bias_update_rate);
  MOE_CHECK(c.load_balancing.size() == c.aux_loss_coeff.size(),
            "--moe-aux-loss-coeff needs one coefficient per --moe-router-load-balancing-type ({} types, {} "
            "coefficients)",
            c.load_balancing.size(), c.aux_loss_coeff.size());
  for (size_t i = 0; i < c.load_balancing.size(); i++) {
    MOE_CHECK(c.aux_loss_coeff[i] >= 0, "--moe-aux-loss-coeff must be >= 0, got {}", c.aux_loss_coeff[i]);
    for (size_t j = 0; j < i; j++)
      MOE_CHECK(c.load_balancing[i] != c.load_balancing[j], "--moe-router-load-balancing-type lists {} twice",
                load_balancing_name(c.load_balancing[i]));
  }
  MOE_CHECK(c.z_loss_coeff >= 0, "--moe-z-loss-coeff must be >= 0, got {}", c.z_loss_coeff);
  MOE_CHECK(c.input_jitter_eps >= 0 && c.input_jitter_eps < 1, "--moe-input-jitter-eps must be in [0, 1), got {}",
            c.input_jitter_eps);
  MOE_CHECK(!c.pad_to_capacity || c.capacity_factor >= 0,
            "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  MOE_CHECK(c.topk_scaling_factor >= 0, "--moe-router-topk-scaling-factor must be positive, got {}",
            c.topk_scaling_factor);
}

int64_t expert_capacity(const RouterConfig& c, int64_t T) {
  const double cap = std::ceil(static_cast<double>(c.topk) * static_cast<double>(T) /
                               static_cast<double>(c.num_experts) * c.capacity_factor);
  MOE_CHECK(cap < 0x1p62,
            "--moe-expert-capacity-factor {} gives each expert a capacity of {} tokens: too large to hold",
            c.capacity_factor, cap);
  return static_cast<int64_t>(cap);
}

}  // namespace moecore::moe
