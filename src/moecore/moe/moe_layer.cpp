// MoE layer (see moe_layer.h). Backward runs the stages in reverse; the router's input gradient adds to the
// dispatched tokens' gradient because x feeds both.
#include "moecore/moe/moe_layer.h"

#include <cctype>

#include "moecore/kernels/elementwise.h"
#include "moecore/moe/flex_dispatcher.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/nn/substeps.h"

namespace moecore::moe {

void validate(const MoELayerConfig& c) {
  validate(c.router);
  MOE_CHECK(c.ffn_hidden > 0, "--moe-ffn-hidden-size must be positive, got {}", c.ffn_hidden);
  MOE_CHECK(c.shared_ffn_hidden >= 0, "--moe-shared-expert-intermediate-size must be >= 0, got {}",
            c.shared_ffn_hidden);
  MOE_CHECK(!c.shared_expert_gate || c.shared_ffn_hidden > 0,
            "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
  MOE_CHECK(!c.bias || c.shared_ffn_hidden == 0,
            "--moe-shared-expert-intermediate-size with linear biases: shared experts have no bias (Megatron's "
            "SharedExpertMLP refuses add_bias_linear); pass --disable-bias-linear");
}

namespace {
// The experts this rank holds: all of them, or its contiguous share under expert parallelism.
ExpertsConfig experts_config(const MoELayerConfig& c) {
  const int64_t ep = c.ep_group ? c.ep_group->size() : 1, rank = c.ep_group ? c.ep_group->rank() : 0;
  MOE_CHECK(c.router.num_experts % ep == 0, "--num-experts {} is not divisible by --expert-model-parallel-size {}",
            c.router.num_experts, ep);
  const int64_t n = c.router.num_experts / ep;
  const int64_t etp = c.etp_group ? c.etp_group->size() : 1;
  MOE_CHECK(c.ffn_hidden % etp == 0, "--moe-ffn-hidden-size {} is not divisible by --expert-tensor-parallel-size {}",
            c.ffn_hidden, etp);
  ExpertsConfig e{c.router.hidden, c.ffn_hidden / etp, n, n * rank, c.activation, c.init_std, c.output_init_std, c.low};
  e.recompute_act = c.recompute_moe_act;
  e.bias = c.bias;
  e.num_global_experts = c.router.num_experts;
  e.etp_size = etp;
  e.etp_rank = c.etp_group ? c.etp_group->rank() : 0;
  e.etp_group = c.etp_group;
  return e;
}
RouterConfig router_config(const MoELayerConfig& c) {
  RouterConfig r = c.router;
  r.bias = c.bias;
  if (c.tp.on()) r.count_group = c.tp.group;  // TP×CP
  if (c.tp_cp_group) r.count_group = c.tp_cp_group;
  return r;
}
std::unique_ptr<TokenDispatcher> make_dispatcher(const MoELayerConfig& c) {
  if (!c.ep_group || c.ep_group->size() == 1) return std::make_unique<LocalTokenDispatcher>(c.router.num_experts);
  if (c.allgather_dispatcher) return std::make_unique<AllGatherTokenDispatcher>(*c.ep_group, c.router.num_experts);
  if (c.flex_dispatcher) return std::make_unique<FlexTokenDispatcher>(*c.ep_group, c.router.num_experts);
  return std::make_unique<AllToAllTokenDispatcher>(*c.ep_group, c.router.num_experts);
}
}  // namespace

bool MoELayer::posted(bool in_flight, nn::A2A kind) const {
  if (in_flight) nn::SubSteps::posted(name_, kind);
  return in_flight;
}

void MoELayer::waited(bool was_in_flight, nn::A2A kind) const {
  if (was_in_flight) nn::SubSteps::waited(name_, kind);
}

MoELayer::MoELayer(nn::ParamRegistry& reg, const std::string& name, const MoELayerConfig& cfg)
    : name_(name),
      cfg_(cfg),
      router_(reg, name + ".router", router_config(cfg)),
      experts_(reg, name + ".experts", experts_config(cfg)),
      dispatcher_(make_dispatcher(cfg)),
      side_(cfg.shared_expert_overlap) {
  validate(cfg);
  if (cfg.etp_group && cfg.etp_group->size() > 1)
    etp_ = std::make_unique<ExpertTensorParallel>(*cfg.etp_group, experts_.config().num_experts);
  if (cfg.shared_ffn_hidden > 0) {
    nn::MLPConfig mc{cfg.router.hidden, cfg.shared_ffn_hidden, cfg.activation, false,
                     cfg.init_std,      cfg.output_init_std,   cfg.low,        cfg.tp};
    shared_ = std::make_unique<SharedExperts>(reg, name + ".shared_experts", mc, cfg.shared_expert_gate,
                                              cfg.recompute_shared_experts);
  }
}

std::unique_ptr<nn::FeedForward::Stash> MoELayer::make_stash() const {
  auto s = std::make_unique<Stash>();
  if (shared_) s->shared = shared_->make_stash();
  return s;
}

Tensor MoELayer::forward(const Tensor& x_SBH, nn::FeedForward::Stash& base) {
  auto& st = static_cast<Stash&>(base);
  if (!cfg_.recompute_moe || st.recompute) return forward_impl(x_SBH, st);
  Tensor y = forward_impl(x_SBH, st);
  // Keep the input and what a replay needs; drop the rest (a fresh stash of the same layer).
  Stash kept;
  kept.loss_scale = st.loss_scale;
  kept.router.replay = st.router.replay;
  kept.router.aux_loss_total = st.router.aux_loss_total;
  if (shared_) kept.shared = shared_->make_stash();
  kept.x_in = x_SBH;
  st = std::move(kept);
  return y;
}

void MoELayer::carry_replay(const nn::FeedForward::Stash& from, nn::FeedForward::Stash& to) const {
  const auto& f = static_cast<const Stash&>(from);
  auto& t = static_cast<Stash&>(to);
  t.router.replay = f.router.replay;
  t.router.aux_loss_total = f.router.aux_loss_total;
}

void MoELayer::drop_input(const Tensor& x, nn::FeedForward::Stash& base) const {
  auto& st = static_cast<Stash&>(base);
  if (st.x_in.defined()) {
    st.x_in = Tensor();
    return;
  }
  st.router_input_dropped = st.router_input_rounded || st.router.x_r.shares_storage(x);
  if (st.router_input_dropped) st.router.x_r = Tensor();
  if (shared_) shared_->drop_input(x, st.shared);
}

void MoELayer::restore_input(const Tensor& x, nn::FeedForward::Stash& base) const {
  auto& st = static_cast<Stash&>(base);
  if (cfg_.recompute_moe) {
    st.x_in = x;
    return;
  }
  if (st.router_input_dropped) {
    const Tensor x_TH = x.reshape({x.rows(), x.cols()});
    st.router.x_r = st.router_input_rounded ? x_TH.as_dtype(*cfg_.low) : x_TH;
  }
  st.router_input_dropped = false;
  if (shared_) shared_->restore_input(x, st.shared);
}

// With bf16 experts a row gradient's f32 values are rounded once: by the permutation as it copies them where a token
// has at most two rows (a read of 4 bytes and writes of 2 per row), or first, into a bf16 [T, H] the permutation
// copies from, where more rows would read the f32 values more often than a cast pass costs.
Tensor MoELayer::rows_input(const Tensor& x_TH) const {
  return cfg_.low && cfg_.router.topk > 2 ? x_TH.as_dtype(*cfg_.low) : x_TH;
}

Tensor MoELayer::forward_impl(const Tensor& x_SBH, Stash& st) {
  MOE_ASSERT(x_SBH.ndim() == 3 && x_SBH.dim(2) == cfg_.router.hidden);
  st.S = x_SBH.dim(0);
  st.B = x_SBH.dim(1);
  const int64_t T = st.S * st.B, H = cfg_.router.hidden;
  const Tensor x_TH = x_SBH.reshape({T, H});
  Tensor shared_out;
  if (shared_) {  // --moe-shared-expert-overlap on a GPU: beside the router, dispatch and routed experts
    side_.fork(x_SBH.device());
    shared_out = shared_->forward(x_SBH, st.shared, st.recompute);
    side_.end();
  }
  st.router.recompute = st.recompute;
  // --bf16: the tokens rounded once, into a [T, H] the router keeps for its weight gradient (as Megatron's router
  // keeps its bf16 input) and the dispatcher copies the experts' rows from.
  const Tensor x16_TH = cfg_.low ? x_TH.as_dtype(*cfg_.low) : Tensor();
  const RoutedTokens routed =
      router_.forward(x_TH, st.S, st.B, training_, st.router, x16_TH.defined() ? &x16_TH : nullptr);
  st.router_input_rounded = x16_TH.defined() && st.router.x_r.shares_storage(x16_TH);
  Tensor x_RH, probs_R;
  // Without expert tensor parallelism (whose gather reorders the rows) the rows arrive in the experts' padded layout.
  st.plan.row_align = etp_ ? 1 : GroupedExperts::row_align(x_TH.device());
  if (cfg_.low) st.plan.rows_dtype = *cfg_.low;
  // Under the combined 1F1B schedule (nn/substeps.h) the other micro-batch runs a sub-step while each exchange is in
  // flight.
  TokenDispatcher::Pending pending;
  dispatcher_->dispatch_start(cfg_.low ? x16_TH : x_TH, routed, st.plan, pending);
  const bool dispatching = posted(pending.in_flight(), nn::A2A::Dispatch);
  nn::SubSteps::boundary(name_, "dispatch wait + experts");
  dispatcher_->dispatch_finish(pending, st.plan, x_RH, probs_R);
  waited(dispatching, nn::A2A::Dispatch);
  Tensor y_RH;
  if (etp_) {
    Tensor x_all, probs_all;
    etp_->gather(x_RH, probs_R, st.plan.tokens_per_expert, st.etp, x_all, probs_all);
    y_RH = etp_->reduce_scatter(experts_.forward(x_all, probs_all, st.etp.tokens_per_expert, st.experts), st.etp);
  } else {
    y_RH = experts_.forward(x_RH, probs_R, st.plan.tokens_per_expert, st.experts);
  }
  dispatcher_->combine_start(y_RH, st.plan, pending);
  const bool combining = posted(pending.in_flight(), nn::A2A::Combine);
  nn::SubSteps::boundary(name_, "combine wait + the rest");
  Tensor y = dispatcher_->combine_finish(pending, st.plan);
  waited(combining, nn::A2A::Combine);
  side_.join();
  if (shared_) kernels::add_(y, shared_out);
  return y.reshape(x_SBH.shape());
}

Tensor MoELayer::backward(const Tensor& dy_SBH, nn::FeedForward::Stash& base) {
  auto& st = static_cast<Stash&>(base);
  if (st.x_in.defined()) {  // moe recompute: the whole layer again (router replayed, all-to-all repeated)
    const Tensor x = st.x_in;
    st.x_in = Tensor();
    st.recompute = true;
    forward_impl(x, st);
    st.recompute = false;
  }
  const int64_t T = st.S * st.B, H = cfg_.router.hidden;
  // Under the overlap the shared experts' backward is queued first, beside the routed backward; either way its
  // input gradient is added last.
  const bool shared_first = shared_ && side_.active(dy_SBH.device());
  Tensor shared_dx;
  if (shared_first) {
    side_.fork(dy_SBH.device());
    shared_dx = shared_->backward(dy_SBH, st.shared);
    side_.end();
  }
  const Tensor dy_TH = dy_SBH.reshape({T, H});
  TokenDispatcher::Pending cb;
  dispatcher_->combine_backward_start(rows_input(dy_TH), st.plan, cb);
  const bool combine_backward = posted(cb.in_flight(), nn::A2A::CombineBackward);
  nn::SubSteps::boundary(name_, "combine-backward wait + experts backward");
  const Tensor dy_RH = dispatcher_->combine_backward_finish(cb, st.plan);  // in the rows' dtype
  waited(combine_backward, nn::A2A::CombineBackward);
  // With the overlap the experts' weight-gradient GEMMs wait until the dispatcher's backward all-to-all is in
  // flight, and run beside it (Megatron's --delay-wgrad-compute: data gradients first, so the exchange can start).
  const bool overlap = cfg_.overlap_dispatch_backward;
  Tensor dprobs_R, dx_RH;
  if (etp_) {
    Tensor dprobs_all;
    const Tensor dx_all = experts_.backward(etp_->gather_rows_like(dy_RH, st.etp), st.experts, dprobs_all, overlap);
    dx_RH = etp_->reduce_scatter(dx_all, st.etp);
    dprobs_R = etp_->reduce_scatter(dprobs_all, st.etp);
  } else {
    dx_RH = experts_.backward(dy_RH, st.experts, dprobs_R, overlap);
  }
  Tensor dx, dprobs_TK;
  TokenDispatcher::PendingBackward pending;
  dispatcher_->dispatch_backward_start(dx_RH, dprobs_R, st.plan, pending);
  // MPI moves a large message only inside MPI calls (no progress thread): one test between the two GEMMs lets the
  // exchange advance while they run.
  if (overlap) experts_.backward_wgrad(st.experts, [&] { pending.progress(); });
  const bool dispatch_backward = posted(pending.dx_work.pending(), nn::A2A::DispatchBackward);
  nn::SubSteps::boundary(name_, "dispatch-backward wait + router + attention backward");
  dispatcher_->dispatch_backward_finish(pending, st.plan, cfg_.router.router_dtype, dx, dprobs_TK);
  waited(dispatch_backward, nn::A2A::DispatchBackward);
  router_.backward(dprobs_TK, dx.dtype(), st.loss_scale, st.router, &dx);
  side_.join();
  if (shared_) kernels::add_(dx, (shared_first ? shared_dx : shared_->backward(dy_SBH, st.shared)).reshape({T, H}));
  return dx.reshape(dy_SBH.shape());
}

std::vector<bool> parse_moe_layer_freq(const std::string& spec_in, int64_t num_layers) {
  std::string spec;
  for (char ch : spec_in)
    if (!std::isspace(static_cast<unsigned char>(ch))) spec += ch;
  auto fail = [&](const std::string& why) {
    MOE_CHECK(false,
              "--moe-layer-freq '{}' is not valid ({}); give an integer N (every N-th layer is MoE, starting with "
              "layer 0) or a list such as \"([0]*1+[1]*3)\" with one 0/1 per layer",
              spec_in, why);
  };
  if (spec.empty()) fail("empty");
  bool all_digits = true;
  for (char ch : spec) all_digits &= std::isdigit(static_cast<unsigned char>(ch)) != 0;
  std::vector<bool> out;
  if (all_digits) {
    const long n = std::stol(spec);
    if (n <= 0) fail("the integer must be positive");
    for (int64_t i = 0; i < num_layers; i++) out.push_back(i % n == 0);
    return out;
  }
  // Grammar: expr := '(' expr ')' | term ('+' term)*;  term := '[' digit (',' digit)* ']' ('*' int)?
  size_t pos = 0;
  while (pos < spec.size() && spec[pos] == '(' && spec.back() == ')') {
    spec = spec.substr(1, spec.size() - 2);
  }
  while (pos < spec.size()) {
    if (spec[pos] != '[') fail("expected '[' at offset " + std::to_string(pos));
    pos++;
    std::vector<bool> term;
    while (true) {
      if (pos >= spec.size() || (spec[pos] != '0' && spec[pos] != '1')) fail("list entries must be 0 or 1");
      term.push_back(spec[pos] == '1');
      pos++;
      if (pos < spec.size() && spec[pos] == ',') {
        pos++;
        continue;
      }
      if (pos < spec.size() && spec[pos] == ']') {
        pos++;
        break;
      }
      fail("expected ',' or ']'");
    }
    long times = 1;
    if (pos < spec.size() && spec[pos] == '*') {
      pos++;
      size_t end = pos;
      while (end < spec.size() && std::isdigit(static_cast<unsigned char>(spec[end]))) end++;
      if (end == pos) fail("expected a count after '*'");
      times = std::stol(spec.substr(pos, end - pos));
      pos = end;
    }
    for (long r = 0; r < times; r++) out.insert(out.end(), term.begin(), term.end());
    if (pos < spec.size()) {
      if (spec[pos] != '+') fail("expected '+' between lists");
      pos++;
    }
  }
  if (static_cast<int64_t>(out.size()) != num_layers)
    fail("it has " + std::to_string(out.size()) + " entries for --num-layers " + std::to_string(num_layers));
  return out;
}

// What MoELayer::forward leaves in its Stash (nn/stash_bytes.h).
int64_t moe_layer_stash_bytes(const MoELayerConfig& c, int64_t ep, int64_t etp, const nn::StashDims& d,
                              bool input_dropped) {
  const int64_t T = d.local_rows(), H = c.router.hidden, K = c.router.topk, E = c.router.num_experts;
  const int64_t input = nn::tensor_bytes(T * H, DType::F32);  // x: the pre-MLP norm's output
  // moe recompute: the input alone, kept f32 (the replay routes it again).
  if (c.recompute_moe) return input_dropped ? 0 : input;
  // Routed rows: T·K, balanced over the EP ranks (the same count arrives); with padding to capacity every expert
  // gets its capacity. Under ETP the ETP group's rows are gathered.
  int64_t rows = T * K;
  if (c.router.capacity_factor >= 0 && c.router.pad_to_capacity) rows = E * std::min(expert_capacity(c.router, T), T);
  ExpertsConfig e{H, c.ffn_hidden / etp, E / ep, 0, c.activation, 0, 0, c.low};
  e.recompute_act = c.recompute_moe_act;
  e.bias = c.bias;
  e.etp_size = etp;
  int64_t b = router_stash_bytes(c.router, T, d.training, c.low);
  b += dispatch_plan_bytes(T, rows, rows, ep > 1);
  if (etp > 1) b += nn::tensor_bytes(rows * etp, DType::I32);  // EtpPlan::sorted_from_all
  b += grouped_experts_stash_bytes(e, rows * etp);
  b += shared_experts_stash_bytes(c, d, input_dropped);
  // The input, when the router keeps it (f32 gating input, no jitter; under bf16 its bf16 rounding instead) or the
  // shared experts do (f32: no TP, or the gate's x_TH; under shared_experts recompute); dropped with the norm's output
  // under layernorm recompute.
  const bool jitter = d.training && c.router.input_jitter_eps > 0;
  const bool router_keeps = !c.low && c.router.router_dtype == DType::F32 && !jitter;
  const bool shared_keeps =
      c.shared_ffn_hidden > 0 && !c.recompute_shared_experts && !c.low && (c.shared_expert_gate || d.tp == 1);
  if (!input_dropped && (router_keeps || shared_keeps || (c.shared_ffn_hidden > 0 && c.recompute_shared_experts)))
    b += input;
  if (!input_dropped && c.low && !jitter) b += nn::tensor_bytes(T * H, *c.low);  // the router's x_r
  return b;
}

}  // namespace moecore::moe
