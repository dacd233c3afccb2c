// Trainer (see trainer.h).
#include "moecore/train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/ckpt/upcycling.h"
#include "moecore/core/allocator.h"
#include "moecore/core/rng.h"
#include "moecore/data/preprocess.h"
#include "moecore/kernels/cpu/adamw.h"
#include "moecore/kernels/cpu/elementwise.h"
#include "moecore/kernels/cpu/gemm.h"

namespace moecore::train {

namespace {
// The group when it has more than one rank (what modules take), else null.
const comm::ProcessGroup* active(const std::unique_ptr<comm::ProcessGroup>& g) {
  return g && g->size() > 1 ? g.get() : nullptr;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Set by SIGTERM/SIGINT (or Trainer::request_stop): training ends at the next step boundary with a checkpoint.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// The schedule flags must match on resume too, as Megatron checks its scheduler state.
const char* const kScheduleKeys[] = {"lr", "min-lr", "lr-decay-style", "lr-warmup-iters", "lr-decay-iters",
                                     "lr-wsd-decay-style", "lr-wsd-decay-iters"};


std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  return fmt::format("{:.1f} {}", b, u[i]);
}
}  // namespace

Trainer::Trainer(TrainConfig cfg, std::FILE* out, bool measure_peak, const comm::ProcessGroup* world)
    : cfg_(std::move(cfg)), out_(out) {
  validate(cfg_);
  const int64_t world_size = world ? world->size() : 1;
  if (world_size > 1 || cfg_.expert_model_parallel_size > 1 || cfg_.tensor_model_parallel_size > 1 ||
      cfg_.expert_tensor_parallel_size > 1) {
    // The two meshes over the ranks (CP and PP are 1 in this build): attention TP×DP, experts ETP×EP×EDP folded
    // onto the same ranks. ParallelState rejects sizes the world cannot hold, a single process with EP > 1
    // included, so no parallel flag is ever silently ignored.
    mesh_ = std::make_unique<comm::ParallelState>(comm::ParallelSizes{
        world_size, cfg_.tensor_model_parallel_size, cfg_.pipeline_model_parallel_size, cfg_.context_parallel_size,
        cfg_.expert_model_parallel_size, cfg_.expert_tensor_parallel_size});
    MOE_ASSERT(world != nullptr);
    dp_ = mesh_->dp;
    world_rank_ = world->rank();
    dp_group_ = std::make_unique<comm::ProcessGroup>(world->split(mesh_->dp_cp));
    stats_group_ = std::make_unique<comm::ProcessGroup>(world->split(mesh_->tp_dp_cp));
    ep_group_ = std::make_unique<comm::ProcessGroup>(world->split(mesh_->ep_groups));
    edp_group_ = std::make_unique<comm::ProcessGroup>(world->split(mesh_->edp_groups));
    tp_group_ = std::make_unique<comm::ProcessGroup>(world->split(mesh_->tp));
    etp_group_ = std::make_unique<comm::ProcessGroup>(world->split(mesh_->etp));
    world_group_ = std::make_unique<comm::ProcessGroup>(world->split({[&] {
      std::vector<int64_t> all(static_cast<size_t>(world_size));
      std::iota(all.begin(), all.end(), 0);
      return all;
    }()}));
    for (auto [g, n] : {std::pair{dp_group_.get(), "dp"}, {stats_group_.get(), "tp-dp"}, {ep_group_.get(), "ep"},
                        {edp_group_.get(), "edp"}, {tp_group_.get(), "tp"}, {etp_group_.get(), "etp"},
                        {world_group_.get(), "world"}})
      g->set_name(n);
    dp_rank_ = dp_group_->rank();
    MOE_CHECK(cfg_.global_batch_size % (cfg_.micro_batch_size * dp_) == 0,
              "--global-batch-size {} must be a multiple of --micro-batch-size {} x data-parallel size {}",
              cfg_.global_batch_size, cfg_.micro_batch_size, dp_);
    if (world_rank_ != 0) out_ = std::fopen("/dev/null", "w");  // one rank speaks
  }
  fmt::print(out_, "moecore train: resolved configuration\n{}", describe(cfg_));
  if (mesh_) fmt::print(out_, "{}", mesh_->describe());
  // Tokenizer and vocabulary.
  if (cfg_.tokenizer_type == "HuggingFaceTokenizer") {
    tok_ = std::make_unique<data::Tokenizer>(
        data::Tokenizer::from_file(data::resolve_tokenizer_json(cfg_.tokenizer_model)));
    vocab_ = tok_->vocab_size();
  } else {
    vocab_ = cfg_.tokenizer_type == "NullTokenizer" ? cfg_.vocab_size + 1 : cfg_.vocab_size;  // NullTokenizer: + EOD
  }
  padded_vocab_ = padded_vocab_size(cfg_, vocab_);
  // A loaded model keeps the vocabulary padding it was saved with (an HF model its vocab_size) when the TP size
  // divides it, so its output layer, logits and loss are the same in every layout.
  if (!cfg_.load.empty()) found_ = ckpt::find_checkpoint(cfg_.load);
  int64_t saved_rows = 0;
  if (found_ && found_->state.contains("vocab")) saved_rows = found_->state["vocab"].value("padded", int64_t{0});
  if (!found_ && !cfg_.load_hf.empty()) {
    hf_ = std::make_unique<ckpt::HFModel>(cfg_.load_hf);
    saved_rows = hf_->architecture().vocab;
  }
  if (saved_rows >= vocab_ && saved_rows % cfg_.tensor_model_parallel_size == 0) padded_vocab_ = saved_rows;
  // Data: enough samples for every step and every evaluation.
  const int64_t gbs = cfg_.global_batch_size;
  const int64_t train_samples = cfg_.skip_train ? 0 : cfg_.train_iters * gbs;
  const int64_t valid_samples = cfg_.eval_iters * gbs;  // every evaluation reads the same first batches
  if (cfg_.mock_data) {
    const uint64_t seed = static_cast<uint64_t>(cfg_.seed);
    if (train_samples > 0)
      data_[0] = std::make_shared<data::MockGPTDataset>(train_samples, cfg_.seq_length, vocab_, seed);
    if (valid_samples > 0)
      data_[1] = std::make_shared<data::MockGPTDataset>(valid_samples, cfg_.seq_length, vocab_, seed + 1);
  } else {
    data_ = data::build_gpt_datasets(cfg_.data_path, cfg_.split, cfg_.seq_length, {train_samples, valid_samples, 0},
                                     static_cast<uint64_t>(cfg_.seed));
  }
  MOE_CHECK(cfg_.skip_train || data_[0], "no training data: --split {} gives the train split no documents", cfg_.split);
  // Model.
  nn::FfnFactory ffn = nullptr;
  if (cfg_.num_experts > 0) {
    const auto is_moe = moe::parse_moe_layer_freq(cfg_.moe_layer_freq, cfg_.num_layers);
    moe::MoELayerConfig mc = moe_layer_config(cfg_);
    mc.ep_group = active(ep_group_);
    mc.etp_group = active(etp_group_);
    mc.tp.group = active(tp_group_);
    mc.router.global_group = active(stats_group_);
    mc.router.global_grad_scale = static_cast<double>(dp_);
    ffn = [is_moe, mc](nn::ParamRegistry& r, const std::string& name, int64_t i) -> std::unique_ptr<nn::FeedForward> {
      if (!is_moe[static_cast<size_t>(i)]) return nullptr;
      return std::make_unique<moe::MoELayer>(r, name, mc);
    };
  }
  nn::GPTConfig gc = gpt_config(cfg_, padded_vocab_);
  gc.tp.group = active(tp_group_);
  model_ = std::make_unique<nn::GPTModel>(gc, reg_, ffn);
  // Replicated-over-TP parameters per gradient bucket: their partial gradients are summed over TP.
  sp_params_.resize(model_->num_layers() + 1);
  if (active(tp_group_))
    for (auto& p : reg_.all())
      if (!p->tensor_parallel && !p->expert_parallel) {
        sp_params_[layer_of(*p)].push_back(p.get());
        sp_params_all_.push_back(p.get());
      }
  reg_.initialize(static_cast<uint64_t>(cfg_.seed));
  stash_ = model_->make_stash();
  if (cfg_.use_distributed_optimizer && dp_group_) {
    std::vector<nn::Parameter*> dense, expert;
    for (auto& p : reg_.all()) (p->expert_parallel ? expert : dense).push_back(p.get());
    auto weight = [this](const nn::Parameter& p) { return norm_weight(p) * (p.expert_parallel ? edp() : dp_); };
    auto bucket = [this](const nn::Parameter& p) { return layer_of(p); };
    dist_dense_ = std::make_unique<optim::ShardedAdamW>(dense, *dp_group_, weight, bucket);
    if (!expert.empty()) dist_expert_ = std::make_unique<optim::ShardedAdamW>(expert, *edp_group_, weight, bucket);
  } else {
    for (auto& p : reg_.all()) {
      adam_m_.push_back(Tensor::zeros(p->value.shape(), DType::F32));
      adam_v_.push_back(Tensor::zeros(p->value.shape(), DType::F32));
    }
    if (dp_group_) {
      buckets_.resize(2 * model_->num_layers() + 2);
      for (auto& p : reg_.all()) {
        buckets_[2 * layer_of(*p) + (p->expert_parallel ? 1 : 0)].params.push_back(p.get());
      }
      for (auto& bk : buckets_) {
        int64_t n = 0;
        for (auto* p : bk.params) n += p->grad.numel();
        bk.flat = Tensor::empty({n}, DType::F32);
      }
    }
  }
  load_at_start();
  if (!cfg_.metrics_file.empty() && world_rank_ == 0) {
    // A resumed run appends to the history (lines past the checkpoint from an interrupted run repeat iterations;
    // the later line is the one that counts).
    metrics_ = std::fopen(cfg_.metrics_file.c_str(), iteration_ > 0 ? "a" : "w");
    MOE_CHECK(metrics_ != nullptr, "cannot write --metrics-file {}", cfg_.metrics_file);
  }
  if (measure_peak) peak_gflops_ = kernels::measure_gemm_peak_gflops(cfg_.bf16 ? DType::BF16 : DType::F32);
  print_memory_plan();
}

Trainer::~Trainer() {
  if (metrics_) std::fclose(metrics_);
  if (world_rank_ != 0 && out_) std::fclose(out_);
}

std::vector<moe::MoELayer*> Trainer::moe_layers() {
  std::vector<moe::MoELayer*> v;
  for (size_t i = 0; i < model_->num_layers(); i++)
    if (auto* l = dynamic_cast<moe::MoELayer*>(&model_->layer(i).ffn())) v.push_back(l);
  return v;
}

double Trainer::step_flops() const {
  // Per token, forward: 2·(GEMM weights touched) + attention scores and values over the causal half.
  const double H = static_cast<double>(cfg_.hidden_size), D = static_cast<double>(cfg_.kv_channels);
  const double Nq = static_cast<double>(cfg_.num_attention_heads), Nkv = static_cast<double>(cfg_.num_query_groups);
  const double S = static_cast<double>(cfg_.seq_length);
  const double gated = cfg_.swiglu ? 3.0 : 2.0;  // weight matrices per FFN
  const double attn = 2.0 * H * D * (2 * Nq + 2 * Nkv) + 2.0 * 2.0 * (S / 2.0) * Nq * D;
  const double dense_ffn = 2.0 * gated * H * static_cast<double>(cfg_.ffn_hidden_size);
  double moe_ffn = dense_ffn;
  std::vector<bool> is_moe(static_cast<size_t>(cfg_.num_layers), false);
  if (cfg_.num_experts > 0) {
    is_moe = moe::parse_moe_layer_freq(cfg_.moe_layer_freq, cfg_.num_layers);
    const double fe = static_cast<double>(cfg_.moe_ffn_hidden_size);
    moe_ffn = 2.0 * gated * H * fe * static_cast<double>(cfg_.moe_router_topk) +
              2.0 * gated * H * static_cast<double>(cfg_.moe_shared_expert_intermediate_size);
  }
  double per_token = 2.0 * H * static_cast<double>(padded_vocab_);  // logits
  for (bool m : is_moe) per_token += attn + (m ? moe_ffn : dense_ffn);
  return 3.0 * per_token * S * static_cast<double>(cfg_.global_batch_size);  // forward + backward (2x)
}

std::map<std::string, double> Trainer::analytic_comm_bytes() const {
  std::map<std::string, double> out;
  if (!mesh_) return out;
  auto size = [](const std::unique_ptr<comm::ProcessGroup>& g) { return static_cast<double>(g ? g->size() : 1); };
  const double TP = size(tp_group_), DP = static_cast<double>(dp_), EP = size(ep_group_), ETP = size(etp_group_),
               EDP = size(edp_group_);
  const double M = static_cast<double>(cfg_.global_batch_size / (cfg_.micro_batch_size * dp_));
  const double T = static_cast<double>(cfg_.seq_length * cfg_.micro_batch_size);  // tokens of a micro-batch
  const double H = static_cast<double>(cfg_.hidden_size), k = static_cast<double>(cfg_.moe_router_topk);
  const double E = static_cast<double>(cfg_.num_experts), ab = cfg_.bf16 ? 2.0 : 4.0;  // dispatched token bytes
  double n_dense = 0, n_rep = 0, n_exp = 0;
  for (auto& p : reg_.all()) {
    const double n = static_cast<double>(p->value.numel());
    if (p->expert_parallel) {
      n_exp += n;
    } else {
      n_dense += n;
      if (!p->tensor_parallel) n_rep += n;
    }
  }
  std::vector<bool> is_moe(static_cast<size_t>(cfg_.num_layers), false);
  if (cfg_.num_experts > 0) is_moe = moe::parse_moe_layer_freq(cfg_.moe_layer_freq, cfg_.num_layers);
  const double Lm = static_cast<double>(std::count(is_moe.begin(), is_moe.end(), true));
  const double Ld = static_cast<double>(cfg_.num_layers) - Lm;
  const bool shared = cfg_.moe_shared_expert_intermediate_size > 0;
  // Tensor/sequence parallel: per micro-batch and direction, the embedding's reduce-scatter, an all-gather and a
  // reduce-scatter around every attention and dense or shared MLP block, the output layer's all-gather; each of a
  // [S·b, H] f32 activation, of which a rank receives (TP−1)/TP. Vocabulary-parallel cross-entropy all-reduces
  // 3 values per token; replicated parameters' gradients are all-reduced once per step.
  if (TP > 1) {
    const double blocks = 2.0 + 2.0 * (static_cast<double>(cfg_.num_layers) + Ld + (shared ? Lm : 0.0));
    out["tp"] = M * (2.0 * blocks * (TP - 1) / TP * T * H * 4 + 2 * (TP - 1) / TP * 3 * T * 4) +
                2 * (TP - 1) / TP * n_rep * 4;
  }
  // Data parallel: ring all-reduce (or reduce-scatter + all-gather) of the gradients, dense over DP, experts over
  // EDP.
  if (DP > 1) out["dp"] = 2 * (DP - 1) / DP * n_dense * 4;
  if (EDP > 1 && n_exp > 0) out["edp"] = 2 * (EDP - 1) / EDP * n_exp * 4;
  // Expert parallel, per micro-batch and MoE layer, with uniform routing: of the T/TP·k rows a rank routes,
  // (EP−1)/EP go to other ranks, as tokens and probabilities, and come back: forward dispatch (ab bytes per value)
  // and combine (f32), backward the same in reverse.
  const double Tl = T / TP, rows = Tl * k;
  if (EP > 1 && Lm > 0) {
    if (cfg_.moe_token_dispatcher_type == "alltoall") {
      out["ep"] = M * Lm * (EP - 1) / EP * rows * (2 * H * (ab + 4) + 2 * 4);
    } else {  // allgather: tokens, probabilities and map gathered; outputs and input gradients reduce-scattered
      out["ep"] = M * Lm * (EP - 1) * Tl * (H * ab + 2 * E * 4 + H * 4 + H * ab + H * 4 + E * 4);
    }
  }
  // Expert tensor parallel: the rows a rank holds after dispatch (T/TP·k on average) are gathered from the other
  // ETP ranks and their partial outputs reduce-scattered back; backward mirrors it (plus probability gradients).
  if (ETP > 1 && Lm > 0) {
    out["etp"] = M * Lm * (ETP - 1) * rows * (H * ab + 4 + H * 4 + H * ab + H * 4 + 4);
  }
  return out;
}

void Trainer::print_memory_plan() {
  const double n = static_cast<double>(reg_.numel());
  int64_t expert_params = 0;
  for (auto& p : reg_.all())
    if (p->name.find(".experts.") != std::string::npos) expert_params += p->value.numel();
  fmt::print(out_, "parameters: {:.2f} M ({:.2f} M in routed experts); vocabulary {} padded to {}\n", n / 1e6,
             static_cast<double>(expert_params) / 1e6, vocab_, padded_vocab_);
  // Activations kept per micro-batch, estimated from the stash contents of each layer.
  const double T = static_cast<double>(cfg_.seq_length * cfg_.micro_batch_size), H = static_cast<double>(cfg_.hidden_size);
  const double qkv = static_cast<double>(cfg_.kv_channels) * static_cast<double>(cfg_.num_attention_heads + 2 * cfg_.num_query_groups);
  double ffn_act = 3.0 * static_cast<double>(cfg_.ffn_hidden_size);
  if (cfg_.num_experts > 0) ffn_act = static_cast<double>(cfg_.moe_router_topk) * (H + 3.0 * static_cast<double>(cfg_.moe_ffn_hidden_size)) + static_cast<double>(cfg_.num_experts);
  const double per_layer = T * (6 * H + 2 * qkv + ffn_act) * 4.0;
  const double logits = T * static_cast<double>(padded_vocab_) * 4.0;
  fmt::print(out_,
             "memory plan: weights {} | gradients {} | Adam moments {} | activations per micro-batch ~{} "
             "({} layers x {} + logits {})\n",
             human_bytes(4 * n), human_bytes(4 * n), human_bytes(8 * n),
             human_bytes(per_layer * static_cast<double>(cfg_.num_layers) + logits), cfg_.num_layers,
             human_bytes(per_layer), human_bytes(logits));
}

StepResult Trainer::train_step() {
  MOE_ASSERT(data_[0]);
  const int64_t micro = cfg_.global_batch_size / (cfg_.micro_batch_size * dp_);
  StepResult r;
  r.lr = lr_schedule(cfg_).lr(iteration_);
  reg_.zero_grad();
  const double scale = 1.0 / static_cast<double>(micro);
  std::optional<nn::Bf16WeightScope> bf16_scope(reg_);  // weights change only after the micro-batches
  for (int64_t m = 0; m < micro; m++) {
    const auto idx = cursor_.micro_batch(m, dp_rank_, dp_, cfg_.micro_batch_size);
    const data::Batch b = data::make_batch(*data_[0], idx);
    r.lm_loss += model_->forward(b.tokens, b.labels, b.loss_mask, stash_) * scale;
    if ((!buckets_.empty() || dist_dense_) && m == micro - 1) {
      // Last micro-batch: each layer's reduction starts as soon as its gradients are final (replicated-over-TP
      // gradients summed over TP first, where the distributed optimizer reduce-scatters them).
      model_->backward(stash_, scale, [this](size_t layer) {
        if (dist_dense_) {
          sum_sequence_parallel_grads(sp_params_[layer]);
          dist_dense_->start_bucket(layer);
          if (dist_expert_) dist_expert_->start_bucket(layer);
        } else {
          start_bucket(2 * layer);
          start_bucket(2 * layer + 1);
        }
      });
    } else {
      model_->backward(stash_, scale);
    }
  }
  bf16_scope.reset();
  cursor_.advance(cfg_.global_batch_size);
  double sq = 0;  // this rank's weighted share of the squared global gradient norm
  if (dp_group_) {
    // Replicated-over-TP parameters (norms, router) hold partial gradients under sequence parallelism: summed over
    // TP first (Megatron's sequence_parallel grads). Then gradients are summed over data-parallel ranks and scaled
    // by 1/DP (Megatron's 1/(DP·CP)): dense gradients over DP×CP, expert shards over EDP (their other
    // contributions arrived through the dispatcher); with the distributed optimizer each rank keeps only its shard
    // of the sums. The reported loss is averaged over DP.
    if (dist_dense_) {
      sq = dist_dense_->reduce_gradients(1.0 / static_cast<double>(dp_));
      if (dist_expert_) sq += dist_expert_->reduce_gradients(1.0 / static_cast<double>(dp_));
    } else {
      finish_buckets();
      sum_sequence_parallel_grads(sp_params_all_);
      for (auto& p : reg_.all()) sq += norm_weight(*p) * kernels::sum_squares(p->grad);
    }
    Tensor loss = Tensor::empty({1}, DType::F64);
    loss.set_item(0, r.lm_loss);
    dp_group_->all_reduce(loss);
    r.lm_loss = loss.item(0) / static_cast<double>(dp_);
    // Global gradient norm: each rank's weighted share (see norm_weight) summed over all ranks, so every parameter
    // element counts exactly once whatever the layout.
    // A stop signal seen by any rank rides along, so every rank ends at the same step boundary.
    Tensor u = Tensor::empty({2}, DType::F64);
    u.set_item(0, sq);
    u.set_item(1, g_stop_signal != 0 ? 1.0 : 0.0);
    world_group_->all_reduce(u);
    sq = u.item(0);
    stop_requested_ = u.item(1) > 0;
  } else {
    for (auto& p : reg_.all()) sq += kernels::sum_squares(p->grad);
    stop_requested_ = g_stop_signal != 0;
  }
  // Once per global batch, after gradients are final: expert-bias counts summed over TP×DP×CP and the bias updated,
  // routing statistics snapshotted, counters reset.
  model_->finish_global_batch();
  r.grad_norm = std::sqrt(sq);
  MOE_CHECK(std::isfinite(r.grad_norm),
            "iteration {}: the gradient norm is {} (lm loss {}); lower --lr, raise --lr-warmup-iters or check the data",
            iteration_ + 1, r.grad_norm, r.lm_loss);
  iteration_++;
  kernels::AdamWParams hp{r.lr, cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps, cfg_.weight_decay};
  if (cfg_.clip_grad > 0) {  // global-norm clipping, applied by the optimizer as it reads each gradient
    const double coeff = cfg_.clip_grad / (r.grad_norm + 1e-6);
    if (coeff < 1.0) hp.grad_scale = coeff;
  }
  if (dist_dense_) {
    dist_dense_->step(hp, iteration_);
    if (dist_expert_) dist_expert_->step(hp, iteration_);
  }
  for (size_t i = 0; i < adam_m_.size(); i++) {
    auto& p = *reg_.all()[i];
    kernels::AdamWParams h = hp;
    if (p.no_weight_decay) h.weight_decay = 0;
    kernels::adamw_step(p.value, p.grad, adam_m_[i], adam_v_[i], h, iteration_);
  }
  // Aux losses as Megatron logs them: L/coeff per layer, averaged over MoE layers and micro-batches.
  std::vector<const nn::RoutingStats*> layers;
  for (size_t i = 0; i < model_->num_layers(); i++)
    if (const nn::RoutingStats* s = model_->routing_stats(i)) layers.push_back(s);
  r.aux_losses.assign(cfg_.moe_router_load_balancing_type.size(), 0.0);
  for (const nn::RoutingStats* l : layers) {
    const auto& s = *l;
    for (size_t t = 0; t < s.loss_sums.size() && t < r.aux_losses.size(); t++)
      r.aux_losses[t] += s.loss_sums[t] / static_cast<double>(std::max<int64_t>(1, s.micro_batches)) /
                         static_cast<double>(layers.size());
    r.z_loss += s.z_loss_sum / static_cast<double>(std::max<int64_t>(1, s.micro_batches)) /
                static_cast<double>(layers.size());
  }
  if (dp_group_ && !layers.empty()) {  // logged aux losses: summed over TP, averaged over DP, as Megatron logs them
    Tensor a = Tensor::empty({static_cast<int64_t>(r.aux_losses.size()) + 1}, DType::F64);
    for (size_t t = 0; t < r.aux_losses.size(); t++) a.set_item(static_cast<int64_t>(t), r.aux_losses[t]);
    a.set_item(static_cast<int64_t>(r.aux_losses.size()), r.z_loss);
    stats_group_->all_reduce(a);  // each TP rank holds its tokens' share of a layer's loss: summed over TP
    // global_aux_loss shares are parts of one global-batch loss: summed, not averaged.
    for (size_t t = 0; t < r.aux_losses.size(); t++)
      r.aux_losses[t] = a.item(static_cast<int64_t>(t)) /
                        (cfg_.moe_router_load_balancing_type[t] == "global_aux_loss" ? 1.0 : static_cast<double>(dp_));
    r.z_loss = a.item(static_cast<int64_t>(r.aux_losses.size())) / static_cast<double>(dp_);
  }
  return r;
}

double Trainer::norm_weight(const nn::Parameter& p) const {
  if (p.expert_parallel) return 1.0 / static_cast<double>(edp());
  const double tp = static_cast<double>(tp_group_ ? tp_group_->size() : 1);
  return 1.0 / (static_cast<double>(dp_) * (p.tensor_parallel ? 1.0 : tp));
}

int64_t Trainer::edp() const { return edp_group_ ? edp_group_->size() : 1; }

size_t Trainer::layer_of(const nn::Parameter& p) const {
  const std::string pre = "decoder.layers.";
  if (p.name.rfind(pre, 0) == 0) return std::stoul(p.name.substr(pre.size()));
  return model_->num_layers();  // embedding, final norm, output layer
}

void Trainer::sum_sequence_parallel_grads(const std::vector<nn::Parameter*>& ps) {
  if (ps.empty()) return;
  int64_t n = 0;
  for (auto* p : ps) n += p->grad.numel();
  if (sp_flat_.numel() < n) sp_flat_ = Tensor::empty({n}, DType::F32);
  Tensor flat = sp_flat_.slice(0, n);
  nn::pack_grads(ps, flat);
  tp_group_->all_reduce(flat);
  nn::unpack_grads(flat, ps);
}

void Trainer::start_bucket(size_t index) {
  Bucket& bk = buckets_[index];
  if (bk.params.empty()) return;
  nn::pack_grads(bk.params, bk.flat);
  // Dense buckets (even index) over DP×CP, expert buckets over EDP; every rank starts them in the same order.
  bk.work = (index % 2 ? edp_group_ : dp_group_)->all_reduce(bk.flat, comm::ReduceOp::Sum, /*async=*/true);
}

void Trainer::finish_buckets() {
  const double s = 1.0 / static_cast<double>(dp_);
  for (auto& bk : buckets_) {
    if (bk.params.empty()) continue;
    bk.work.wait();
    kernels::scale_(bk.flat, s);
    nn::unpack_grads(bk.flat, bk.params);
  }
}

double Trainer::evaluate(int64_t iters) {
  MOE_CHECK(data_[1], "no validation data: --split {} gives the valid split no documents", cfg_.split);
  model_->set_training(false);
  nn::Bf16WeightScope bf16_scope(reg_);
  double sum = 0;
  int64_t n = 0;
  data::SampleCursor c;
  for (int64_t it = 0; it < iters; it++) {
    for (int64_t m = 0; m < cfg_.global_batch_size / cfg_.micro_batch_size; m++) {
      const auto idx = c.micro_batch(m, 0, 1, cfg_.micro_batch_size);
      const data::Batch b = data::make_batch(*data_[1], idx);
      sum += model_->forward(b.tokens, b.labels, b.loss_mask, stash_);
      n++;
    }
    c.advance(cfg_.global_batch_size);
  }
  model_->set_training(true);
  stash_ = model_->make_stash();  // forward-only passes leave stashes filled; start the next step clean
  return n ? sum / static_cast<double>(n) : 0.0;
}

std::string Trainer::generate(const std::string& prompt, int64_t n, double temperature, int64_t top_k,
                              uint64_t seed) {
  MOE_CHECK(tok_, "generation needs --tokenizer-type HuggingFaceTokenizer");
  std::vector<int32_t> ids = tok_->encode(prompt);
  MOE_CHECK(!ids.empty(), "empty prompt");
  const Philox rng(seed, stream_id("generate:" + prompt));
  model_->set_training(false);
  for (int64_t step = 0; step < n; step++) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - cfg_.seq_length);
    const int64_t len = static_cast<int64_t>(ids.size()) - start;
    Tensor t = Tensor::empty({1, len}, DType::I64);
    for (int64_t i = 0; i < len; i++) t.data<int64_t>()[i] = ids[static_cast<size_t>(start + i)];
    const Tensor logits = model_->logits(t);  // [len, V_padded], row i = position i
    const float* row = logits.data<float>() + (len - 1) * padded_vocab_;
    int32_t next = 0;
    if (temperature <= 0) {
      for (int64_t v = 1; v < vocab_; v++)
        if (row[v] > row[next]) next = static_cast<int32_t>(v);
    } else {
      std::vector<int32_t> order(static_cast<size_t>(vocab_));
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = top_k > 0 ? std::min(top_k, vocab_) : vocab_;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      std::vector<double> p(static_cast<size_t>(k));
      double z = 0;
      for (int64_t i = 0; i < k; i++) z += (p[static_cast<size_t>(i)] = std::exp((row[order[static_cast<size_t>(i)]] - row[order[0]]) / temperature));
      double u = rng.uniform(static_cast<uint64_t>(step)) * z;
      next = order[static_cast<size_t>(k - 1)];
      for (int64_t i = 0; i < k; i++) {
        u -= p[static_cast<size_t>(i)];
        if (u <= 0) {
          next = order[static_cast<size_t>(i)];
          break;
        }
      }
    }
    if (tok_->eos_id() && next == *tok_->eos_id()) break;
    ids.push_back(next);
  }
  model_->set_training(true);
  return tok_->decode(ids);
}

double Trainer::unigram_entropy() const {
  MOE_ASSERT(data_[0]);
  std::vector<int64_t> counts(static_cast<size_t>(padded_vocab_), 0);
  std::vector<int64_t> buf(static_cast<size_t>(cfg_.seq_length + 1));
  int64_t total = 0;
  const int64_t n = std::min<int64_t>(data_[0]->size(), 20000);
  for (int64_t i = 0; i < n; i++) {
    data_[0]->get(i, buf.data());
    for (int64_t s = 0; s < cfg_.seq_length; s++) counts[static_cast<size_t>(buf[static_cast<size_t>(s)])]++;
    total += cfg_.seq_length;
  }
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) {
      const double p = static_cast<double>(c) / static_cast<double>(total);
      h -= p * std::log(p);
    }
  return h;
}

void Trainer::write_metrics(const std::string& line) {
  if (!metrics_) return;
  std::fputs(line.c_str(), metrics_);
  std::fputc('\n', metrics_);
  std::fflush(metrics_);
}

void Trainer::log_line(const StepResult& r, double seconds, int64_t steps) {
  const double n = static_cast<double>(std::max<int64_t>(1, interval_steps_));
  const double tokens = static_cast<double>(steps * cfg_.global_batch_size * cfg_.seq_length);
  const double tps = tokens / seconds;
  const double gflops = step_flops() * static_cast<double>(steps) / seconds / 1e9;
  const auto mem = Allocator::instance().stats();
  std::string aux;
  nlohmann::json j = {{"iteration", iteration_},
                      {"consumed_samples", cursor_.consumed_samples},
                      {"lr", r.lr},
                      {"lm_loss", sum_loss_ / n},
                      {"grad_norm", sum_norm_ / n},
                      {"tokens_per_sec", tps},
                      {"gflops", gflops},
                      {"gflops_ratio_to_gemm_peak", peak_gflops_ > 0 ? gflops / peak_gflops_ : 0.0},
                      {"peak_memory_bytes", mem.peak_bytes}};
  const auto layers = moe_layers();
  if (!layers.empty()) {
    for (size_t t = 0; t < cfg_.moe_router_load_balancing_type.size(); t++) {
      const std::string name = moe::load_balancing_name(moe::parse_load_balancing_type(cfg_.moe_router_load_balancing_type[t]));
      if (name == "none") continue;
      aux += fmt::format(" {}: {:.4f} |", name, sum_aux_[t] / n);
      j[name] = sum_aux_[t] / n;
    }
    if (cfg_.moe_z_loss_coeff > 0) {
      aux += fmt::format(" z_loss: {:.4f} |", sum_z_ / n);
      j["z_loss"] = sum_z_ / n;
    }
    nlohmann::json tpe = nlohmann::json::object(), entropy = nlohmann::json::object(),
                   dropped = nlohmann::json::object();
    double worst = 0;
    for (size_t i = 0; i < model_->num_layers(); i++) {
      const nn::RoutingStats* s = model_->routing_stats(i);
      if (!s) continue;
      const std::string key = "layer_" + std::to_string(i);
      tpe[key] = s->tokens_per_expert;
      entropy[key] = s->entropy();
      dropped[key] = s->dropped;
      worst = std::max(worst, s->max_load() / std::max(1.0, s->mean_load()));
    }
    j["tokens_per_expert"] = tpe;
    j["router_entropy"] = entropy;  // nats, mean over the step's tokens
    j["dropped_assignments"] = dropped;
    j["max_over_mean_expert_load"] = worst;
    aux += fmt::format(" max/mean expert load: {:.2f} |", worst);
  }
  fmt::print(out_,
             " iteration {:>8}/{:>8} | consumed samples: {:>10} | learning rate: {:.6E} | lm loss: {:.6E} |{} "
             "grad norm: {:.3f} | tokens/s: {:.0f} | GFLOP/s: {:.1f} ({:.1f}% of GEMM peak) | peak memory: {}\n",
             iteration_, cfg_.train_iters, cursor_.consumed_samples, r.lr, sum_loss_ / n, aux, sum_norm_ / n, tps,
             gflops, peak_gflops_ > 0 ? 100.0 * gflops / peak_gflops_ : 0.0, human_bytes(static_cast<double>(mem.peak_bytes)));
  std::fflush(out_);
  write_metrics(j.dump());
  sum_loss_ = sum_norm_ = sum_z_ = 0;
  std::fill(sum_aux_.begin(), sum_aux_.end(), 0.0);
  interval_steps_ = 0;
}

void Trainer::run() {
  // Under mpirun a rank's stdout is a pty even when the job's output goes to a file, so the redrawn progress
  // line is only shown by a single process; multi-rank runs log every --log-interval steps.
  const bool tty = ::isatty(fileno(out_)) != 0 && !mesh_;
  // With --save, SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C) end training at the next step boundary
  // with a checkpoint; the previous handlers come back afterwards.
  g_stop_signal = 0;
  struct Handlers {
    bool on;
    void (*term)(int) = SIG_DFL;
    void (*intr)(int) = SIG_DFL;
    explicit Handlers(bool enable) : on(enable) {
      if (!on) return;
      term = std::signal(SIGTERM, on_stop_signal);
      intr = std::signal(SIGINT, on_stop_signal);
    }
    ~Handlers() {
      if (!on) return;
      std::signal(SIGTERM, term);
      std::signal(SIGINT, intr);
    }
  } handlers(!cfg_.save.empty());
  if (!cfg_.skip_train && iteration_ >= cfg_.train_iters)
    fmt::print(out_, "the checkpoint is at iteration {}, --train-iters is {}: nothing to train\n", iteration_,
               cfg_.train_iters);
  if (!cfg_.skip_train && iteration_ < cfg_.train_iters) {
    fmt::print(out_, "training {} iterations of {} sequences x {} tokens ({} data-parallel rank(s) x {} micro-batches of {})\n",
               cfg_.train_iters - iteration_, cfg_.global_batch_size, cfg_.seq_length, dp_,
               cfg_.global_batch_size / (cfg_.micro_batch_size * dp_), cfg_.micro_batch_size);
    if (sum_aux_.size() != cfg_.moe_router_load_balancing_type.size())
      sum_aux_.assign(cfg_.moe_router_load_balancing_type.size(), 0.0);
    const double t_start = now_s();
    const int64_t first = iteration_;
    double t_interval = t_start;
    while (iteration_ < cfg_.train_iters) {
      const StepResult r = train_step();
      sum_loss_ += r.lm_loss;
      sum_norm_ += r.grad_norm;
      sum_z_ += r.z_loss;
      for (size_t t = 0; t < r.aux_losses.size(); t++) sum_aux_[t] += r.aux_losses[t];
      interval_steps_++;
      if (tty) {
        const double el = now_s() - t_start;
        const double eta =
            el / static_cast<double>(iteration_ - first) * static_cast<double>(cfg_.train_iters - iteration_);
        fmt::print(out_, "\r[{}/{}] lm loss {:.4f} ETA {:.0f}s   ", iteration_, cfg_.train_iters, r.lm_loss, eta);
        std::fflush(out_);
      }
      if (iteration_ % cfg_.log_interval == 0 || iteration_ == cfg_.train_iters) {
        if (tty) fmt::print(out_, "\r\033[K");
        const double t = now_s();
        log_line(r, t - t_interval, interval_steps_);
        t_interval = now_s();
      }
      if (cfg_.eval_iters > 0 && data_[1] && iteration_ % cfg_.eval_interval == 0 && iteration_ < cfg_.train_iters) {
        const double v = evaluate(cfg_.eval_iters);
        fmt::print(out_, " validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.3f}\n", iteration_,
                   v, std::exp(std::min(v, 50.0)));
        write_metrics(nlohmann::json({{"eval", "valid"}, {"iteration", iteration_}, {"lm_loss", v}}).dump());
        t_interval = now_s();
      }
      const bool exit_now = cfg_.exit_interval > 0 && iteration_ % cfg_.exit_interval == 0;
      if (!cfg_.save.empty() &&
          ((cfg_.save_interval > 0 && iteration_ % cfg_.save_interval == 0) || exit_now || stop_requested_)) {
        if (tty) fmt::print(out_, "\r\033[K");
        save_checkpoint();
        t_interval = now_s();
      }
      if (stop_requested_) {
        fmt::print(out_, "stopping at iteration {} on {}{}\n", iteration_,
                   g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
                   cfg_.save.empty() ? "" : fmt::format("; resume with --load {}", cfg_.save));
        return;
      }
      if (exit_now) {
        fmt::print(out_, "exiting at iteration {} (--exit-interval {}){}\n", iteration_, cfg_.exit_interval,
                   cfg_.save.empty() ? "" : fmt::format("; resume with --load {}", cfg_.save));
        return;
      }
    }
    if (!cfg_.save.empty() && last_saved_ != iteration_) save_checkpoint();
  }
  if (cfg_.eval_iters > 0 && data_[1]) {
    const double v = evaluate(cfg_.eval_iters);
    fmt::print(out_, " validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.3f}\n", iteration_, v,
               std::exp(std::min(v, 50.0)));
    write_metrics(nlohmann::json({{"eval", "valid"}, {"iteration", iteration_}, {"lm_loss", v}}).dump());
    if (data_[0]) {
      const double h = unigram_entropy();
      fmt::print(out_, "final validation loss {:.4f} nats vs unigram entropy of the training data {:.4f} nats ({})\n", v,
                 h, v < h ? "the model uses context" : "NOT below the unigram entropy: train longer or check the data");
    }
  }
  // Where the last step's tokens went, layer by layer.
  for (size_t i = 0; i < model_->num_layers(); i++) {
    const nn::RoutingStats* s = model_->routing_stats(i);
    if (!s || s->tokens_per_expert.empty()) continue;
    const auto& t = s->tokens_per_expert;
    const int64_t mx = *std::max_element(t.begin(), t.end());
    std::string bars;
    for (int64_t c : t) bars += fmt::format(" {}:{}", c, std::string(static_cast<size_t>(mx > 0 ? 1 + 8 * c / mx : 0), '#'));
    fmt::print(out_, "expert load, layer {} (tokens per expert, last step{}):{}\n", i, mesh_ ? ", this rank's tokens" : "",
               bars);
  }
  if (!cfg_.generate_prompts.empty() && tok_) {
    for (const auto& p : cfg_.generate_prompts) {
      fmt::print(out_, "--- greedy: {}\n", generate(p, cfg_.generate_tokens, 0.0, 0, static_cast<uint64_t>(cfg_.seed)));
      fmt::print(out_, "--- sampled (temperature {}, top-k {}): {}\n", cfg_.generate_temperature, cfg_.generate_top_k,
                 generate(p, cfg_.generate_tokens, cfg_.generate_temperature, cfg_.generate_top_k,
                          static_cast<uint64_t>(cfg_.seed)));
    }
  }
}

// ---- checkpoints ----

namespace {
std::string expert_bias_name(moe::MoELayer& l) {
  const std::string& w = l.router().weight().name;  // ...mlp.router.weight
  return w.substr(0, w.size() - std::string("weight").size()) + "expert_bias";
}
ckpt::Box whole(const Tensor& t) { return ckpt::whole_box(t.shape()); }
// "--flag: saved in the checkpoint, here" lines for the flags of `keys` whose values differ.
template <typename Keys>
std::string flag_differences(const nlohmann::json& saved, const nlohmann::json& here, const Keys& keys,
                             const char* where) {
  std::string out;
  for (const auto& key : keys) {
    const std::string k = key;
    if (saved.contains(k) && saved[k] != here[k])
      out += fmt::format("\n  --{}: {} in {}, {} here", k, saved[k].dump(), where, here[k].dump());
  }
  return out;
}
// Position of each parameter in the registry (the order of the Adam moment lists).
std::map<const nn::Parameter*, size_t> registry_index(const nn::ParamRegistry& reg) {
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < reg.all().size(); i++) index[reg.all()[i].get()] = i;
  return index;
}
bool is_vocab_parameter(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}
}  // namespace

void Trainer::request_stop(int signal) { g_stop_signal = signal; }

bool Trainer::stores(const nn::Parameter& p) const {
  if (!mesh_) return true;
  if (p.expert_parallel) return edp_group_->rank() == 0;
  return dp_group_->rank() == 0 && (p.tensor_parallel || tp_group_->rank() == 0);
}

void Trainer::moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const {
  const auto& all = reg_.all();
  if (!dist_dense_) {
    m = adam_m_;
    v = adam_v_;
    return;
  }
  const auto index = registry_index(reg_);
  m.assign(all.size(), Tensor());
  v.assign(all.size(), Tensor());
  for (const auto* opt : {dist_dense_.get(), dist_expert_.get()}) {
    if (!opt) continue;
    std::vector<Tensor> om, ov;
    opt->gather_moments(om, ov);
    for (size_t i = 0; i < om.size(); i++) {
      m[index.at(opt->params()[i])] = om[i];
      v[index.at(opt->params()[i])] = ov[i];
    }
  }
}


std::vector<ckpt::LoadTarget> Trainer::load_targets(bool optimizer, std::vector<Tensor>& m, std::vector<Tensor>& v) {
  std::vector<ckpt::LoadTarget> t;
  const auto& all = reg_.all();
  for (auto& p : all)
    t.push_back({p->name, ckpt::box_of(*p), &p->value, is_vocab_parameter(p->name) ? vocab_ : 0});
  if (cfg_.moe_router_enable_expert_bias)
    for (auto* l : moe_layers()) t.push_back({expert_bias_name(*l), whole(l->router().expert_bias()), &l->router().expert_bias()});
  if (optimizer) {
    m.clear();
    v.clear();
    for (auto& p : all) {
      m.push_back(Tensor::empty(p->value.shape(), DType::F32));
      v.push_back(Tensor::empty(p->value.shape(), DType::F32));
    }
    for (size_t i = 0; i < all.size(); i++) {
      const int64_t vr = is_vocab_parameter(all[i]->name) ? vocab_ : 0;
      t.push_back({"optimizer.exp_avg." + all[i]->name, ckpt::box_of(*all[i]), &m[i], vr});
      t.push_back({"optimizer.exp_avg_sq." + all[i]->name, ckpt::box_of(*all[i]), &v[i], vr});
    }
  }
  return t;
}

nlohmann::json Trainer::train_state() const {
  nlohmann::json counts = nlohmann::json::object();
  for (auto* l : const_cast<Trainer*>(this)->moe_layers()) counts[l->router().weight().name] = l->router().forward_count();
  auto size = [](const std::unique_ptr<comm::ProcessGroup>& g) { return g ? g->size() : int64_t{1}; };
  return {{"format", "moecore-train-state-1"},
          {"moecore_version", MOECORE_VERSION},
          {"iteration", iteration_},
          {"consumed_samples", cursor_.consumed_samples},
          {"optimizer", true},
          {"vocab", {{"size", vocab_}, {"padded", padded_vocab_}}},
          {"layout",
           {{"world", size(world_group_)}, {"tp", size(tp_group_)}, {"dp", dp_}, {"ep", size(ep_group_)},
            {"etp", size(etp_group_)}, {"distributed_optimizer", dist_dense_ != nullptr}}},
          {"rng", {{"seed", cfg_.seed}, {"router_forward_counts", counts}}},
          {"log_interval_sums",
           {{"lm_loss", sum_loss_}, {"grad_norm", sum_norm_}, {"z_loss", sum_z_}, {"aux", sum_aux_},
            {"steps", interval_steps_}}},
          {"config", config_json(cfg_)}};
}

std::string Trainer::save_checkpoint() {
  MOE_CHECK(!cfg_.save.empty(), "no --save directory to save a checkpoint to");
  const double t0 = now_s();
  std::vector<Tensor> m, v;
  moments(m, v);
  std::vector<ckpt::StoredTensor> mine;
  const auto& all = reg_.all();
  int64_t bytes = 0;
  for (size_t i = 0; i < all.size(); i++) {
    const nn::Parameter& p = *all[i];
    if (!stores(p)) continue;
    const ckpt::Box b = ckpt::box_of(p);
    mine.push_back({p.name, b, p.value});
    mine.push_back({"optimizer.exp_avg." + p.name, b, m[i]});
    mine.push_back({"optimizer.exp_avg_sq." + p.name, b, v[i]});
    bytes += 3 * static_cast<int64_t>(p.value.nbytes());
  }
  if (world_rank_ == 0 && cfg_.moe_router_enable_expert_bias)
    for (auto* l : moe_layers()) mine.push_back({expert_bias_name(*l), whole(l->router().expert_bias()), l->router().expert_bias()});
  std::vector<std::pair<std::string, std::string>> extra;
  if (tok_ && world_rank_ == 0) {  // the checkpoint carries its tokenizer: `moecore generate` needs nothing else
    const std::string json = data::resolve_tokenizer_json(cfg_.tokenizer_model);
    extra.push_back({"tokenizer.json", ckpt::read_file(json)});
    const auto config = std::filesystem::path(json).parent_path() / "tokenizer_config.json";  // EOS
    if (std::filesystem::exists(config)) extra.push_back({"tokenizer_config.json", ckpt::read_file(config.string())});
  }
  ckpt::SaveFault fault;
  if (!cfg_.fault_kill_during_save.empty()) {
    const auto colon = cfg_.fault_kill_during_save.find(':');
    fault = {std::stoll(cfg_.fault_kill_during_save.substr(0, colon)),
             std::stoll(cfg_.fault_kill_during_save.substr(colon + 1))};
  }
  const std::string dir =
      ckpt::save_checkpoint(cfg_.save, iteration_, mine, train_state(), world_group_.get(), extra, fault);
  Tensor total = Tensor::empty({1}, DType::F64);
  total.set_item(0, static_cast<double>(bytes));
  if (world_group_) world_group_->all_reduce(total);
  const double secs = now_s() - t0;
  fmt::print(out_, " saved checkpoint at iteration {} to {} ({} in {:.2f} s)\n", iteration_, dir,
             human_bytes(total.item(0)), secs);
  std::fflush(out_);
  last_saved_ = iteration_;
  return dir;
}

void Trainer::load_checkpoint(const std::string& dir, const nlohmann::json& state) {
  const std::string where = dir + "/" + ckpt::kStateFile;
  MOE_CHECK(state.contains("config") && state["config"].is_object(), "{} has no configuration", where);
  const nlohmann::json& saved = state["config"];
  const nlohmann::json here = config_json(cfg_);
  const std::string model_diff = flag_differences(saved, here, model_flag_names(), "the checkpoint");
  if (!cfg_.finetune) {
    MOE_CHECK(model_diff.empty(),
              "{} holds a different model:{}\npass the checkpoint's values to resume it (or --finetune to start a new "
              "run from its weights)",
              dir, model_diff);
    const std::string sched_diff = flag_differences(saved, here, kScheduleKeys, "the checkpoint");
    MOE_CHECK(sched_diff.empty(),
              "{} was trained with a different learning-rate schedule:{}\npass the same values to resume it, or "
              "--finetune to start a new schedule from its weights",
              dir, sched_diff);
  } else if (!model_diff.empty()) {
    fmt::print(out_, "note: --finetune from a checkpoint whose model flags differ:{}\n", model_diff);
  }
  const bool has_optim = state.value("optimizer", false);
  const bool optim = has_optim && !cfg_.finetune && !cfg_.no_load_optim;
  std::vector<Tensor> m, v;
  ckpt::load_tensors(dir, load_targets(optim, m, v));
  if (dist_dense_) {
    const auto index = registry_index(reg_);
    for (auto* opt : {dist_dense_.get(), dist_expert_.get()}) {
      if (!opt) continue;
      if (!optim) {
        opt->refresh_master();
        continue;
      }
      std::vector<Tensor> om, ov;
      for (auto* p : opt->params()) {
        om.push_back(m[index.at(p)]);
        ov.push_back(v[index.at(p)]);
      }
      opt->load_moments(om, ov);
    }
  } else if (optim) {
    adam_m_ = m;
    adam_v_ = v;
  }
  const bool release = state.value("release", false);  // a converted model: weights only
  if (!cfg_.finetune && !release) {
    iteration_ = state.at("iteration").get<int64_t>();
    cursor_.consumed_samples = state.at("consumed_samples").get<int64_t>();
    const auto& sums = state.at("log_interval_sums");
    sum_loss_ = sums.at("lm_loss").get<double>();
    sum_norm_ = sums.at("grad_norm").get<double>();
    sum_z_ = sums.at("z_loss").get<double>();
    sum_aux_ = sums.at("aux").get<std::vector<double>>();
    interval_steps_ = sums.at("steps").get<int64_t>();
    if (!cfg_.no_load_rng) {
      const auto& counts = state.at("rng").at("router_forward_counts");
      for (auto* l : moe_layers()) {
        const std::string& n = l->router().weight().name;
        MOE_CHECK(counts.contains(n), "{}: no RNG state for {} (pass --no-load-rng to start its noise afresh)",
                  where, n);
        l->router().forward_count() = counts[n].get<uint64_t>();
      }
    }
  }
  last_saved_ = iteration_;
  loaded_from_ = dir;
  fmt::print(out_, " loaded checkpoint {}: iteration {}, consumed samples {}, {}\n", dir, iteration_,
             cursor_.consumed_samples,
             optim       ? "optimizer state restored"
             : release   ? "a converted model (weights only)"
             : has_optim ? (cfg_.finetune ? "weights only (--finetune)" : "optimizer state not loaded (--no-load-optim)")
                         : "the checkpoint has no optimizer state: Adam moments start at zero");
}

void Trainer::load_hf(const std::string& dir) {
  MOE_ASSERT(hf_ && hf_->dir() == dir);
  ckpt::HFModel& m = *hf_;
  std::map<std::string, nn::Parameter*> mine;
  for (auto& p : reg_.all()) mine[p->name] = p.get();
  std::string problems;
  for (const auto& t : ckpt::native_tensors(m.architecture())) {
    const auto it = mine.find(t.name);
    if (it == mine.end()) {
      problems += fmt::format("\n  {} (from {}) has no place in this model", t.name, t.pieces.front().hf_name);
      continue;
    }
    nn::Parameter& p = *it->second;
    const ckpt::Box b = ckpt::box_of(p);
    if (!(b.global == t.global)) {
      problems += fmt::format("\n  {}: {} in the HF model, {} here", t.name, t.global.str(), b.global.str());
      mine.erase(it);
      continue;
    }
    ckpt::copy_intersection(m.read(t), ckpt::whole_box(t.global), p.value, b);
    mine.erase(it);
  }
  for (const auto& [name, p] : mine) problems += fmt::format("\n  {}: not in the HF model", name);
  MOE_CHECK(problems.empty(), "--load-hf {}: the model built from these flags does not match it:{}\n(drop the flags "
            "that change the architecture: --load-hf sets it from config.json)", dir, problems);
  for (auto* opt : {dist_dense_.get(), dist_expert_.get()})
    if (opt) opt->refresh_master();
  loaded_from_ = dir;
  fmt::print(out_, " loaded HuggingFace {} model {}: weights only, iteration 0\n", m.architecture().kind, dir);
  hf_.reset();  // its open files
}

void Trainer::upcycle(const std::string& dir, const nlohmann::json& state) {
  const std::string where = dir + "/" + ckpt::kStateFile;
  const nlohmann::json& saved = state.at("config");
  MOE_CHECK(saved.value("num-experts", int64_t{0}) == 0,
            "--moe-use-upcycling: {} is already an MoE checkpoint (upcycling starts from a dense one)", dir);
  const nlohmann::json here = config_json(cfg_);
  const char* const dense_keys[] = {"num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads",
                                   "num-query-groups", "kv-channels", "qk-layernorm", "rotary-base", "rotary-percent",
                                   "norm-epsilon", "untie-embeddings-and-output-weights", "swiglu", "squared-relu",
                                   "disable-bias-linear"};
  const std::string diff = flag_differences(saved, here, dense_keys, "the dense checkpoint");
  MOE_CHECK(diff.empty(), "--moe-use-upcycling: the non-MoE flags must match the dense model:{}", diff);
  // Everything outside the MoE layers' mlp loads as it is.
  std::vector<std::string> moe_prefixes;
  for (auto* l : moe_layers()) {
    const std::string& w = l->router().weight().name;  // decoder.layers.N.mlp.router.weight
    moe_prefixes.push_back(w.substr(0, w.size() - std::string("router.weight").size()));
  }
  auto in_moe = [&](const std::string& name) {
    for (const auto& p : moe_prefixes)
      if (name.rfind(p, 0) == 0) return true;
    return false;
  };
  std::vector<ckpt::LoadTarget> targets;
  for (auto& p : reg_.all())
    if (!in_moe(p->name))
      targets.push_back({p->name, ckpt::box_of(*p), &p->value, is_vocab_parameter(p->name) ? vocab_ : 0});
  ckpt::load_tensors(dir, targets);
  // Each MoE layer from its dense FFN (ckpt/upcycling).
  const int64_t g = cfg_.moe_upcycling_granularity, E = cfg_.num_experts, r = E / g, H = cfg_.hidden_size;
  const int64_t F = cfg_.ffn_hidden_size;
  const double s = ckpt::upcycling_scale(E, g, cfg_.moe_router_topk, cfg_.moe_router_pre_softmax,
                                         cfg_.swiglu || cfg_.squared_relu);
  const int64_t halves = cfg_.swiglu ? 2 : 1;
  for (const std::string& pre : moe_prefixes) {
    // The dense fc1 is stored as [2, F, H] (gated) or [F, H]: a whole box of either has the same bytes.
    Tensor d1 = Tensor::empty({halves, F, H}, DType::F32), d2 = Tensor::empty({H, F}, DType::F32);
    Tensor d1_view = cfg_.swiglu ? d1 : d1.reshape({F, H});
    ckpt::load_tensors(dir, {{pre + "linear_fc1.weight", whole(d1_view), &d1_view},
                             {pre + "linear_fc2.weight", whole(d2), &d2}});
    auto [e1, e2] = ckpt::upcycle_experts(d1, d2, E, g, s);
    nn::Parameter& fc1 = reg_.get(pre + "experts.linear_fc1.weight");
    nn::Parameter& fc2 = reg_.get(pre + "experts.linear_fc2.weight");
    Tensor e1_view = cfg_.swiglu ? e1 : e1.reshape({E, F / g, H});
    ckpt::copy_intersection(e1_view, whole(e1_view), fc1.value, ckpt::box_of(fc1));
    ckpt::copy_intersection(e2, whole(e2), fc2.value, ckpt::box_of(fc2));
    ckpt::tie_router_rows(reg_.get(pre + "router.weight").value, g);  // replicated, initialized by global index
  }
  for (auto* opt : {dist_dense_.get(), dist_expert_.get()})
    if (opt) opt->refresh_master();
  loaded_from_ = dir;
  fmt::print(out_,
             " upcycled the dense checkpoint {} into {} experts per MoE layer (granularity {}, {} replicas, "
             "weights scaled by {:.4f})\n",
             dir, E, g, r, s);
}

void Trainer::load_at_start() {
  if (cfg_.moe_use_upcycling) {
    // Once the upcycled model is saved, later runs resume it from --save (as Megatron does).
    if (const auto own = ckpt::find_checkpoint(cfg_.save)) {
      load_checkpoint(own->dir, own->state);
      return;
    }
    MOE_CHECK(found_, "--moe-use-upcycling: --load {} holds no dense checkpoint", cfg_.load);
    upcycle(found_->dir, found_->state);
    save_checkpoint();
    return;
  }
  if (!cfg_.load.empty()) {
    if (found_) {
      load_checkpoint(found_->dir, found_->state);
      return;
    }
    MOE_CHECK(!cfg_.finetune, "--finetune: --load {} holds no checkpoint (no {} and no index.json)", cfg_.load,
              ckpt::kLatestFile);
    if (cfg_.load_hf.empty())
      fmt::print(out_, "note: --load {} holds no checkpoint (no {}): training starts from scratch\n", cfg_.load,
                 ckpt::kLatestFile);
  }
  if (!cfg_.load_hf.empty()) load_hf(cfg_.load_hf);
}

}  // namespace moecore::train
