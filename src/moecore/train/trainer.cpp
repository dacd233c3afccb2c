// Trainer (see trainer.h).
#include "moecore/train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <optional>

#include "moecore/comm/gpu_transport.h"
#include "moecore/core/allocator.h"
#include "moecore/core/error.h"
#include "moecore/core/timer.h"
#include "moecore/device/device_select.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/id_checks.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/generate.h"
#include "moecore/train/observe/cost_model.h"
#include "moecore/train/observe/health.h"
#include "moecore/train/pipeline/pipeline_stages.h"
#include "moecore/train/run_control.h"
#include "moecore/train/signals.h"
#include "moecore/train/stop_riders.h"

namespace moecore::train {

namespace {
// The signals that end training at the next step boundary (with a checkpoint when --save is given): SIGTERM and
// SIGINT (a scheduler's preemption, Ctrl-C), SIGUSR1 and SIGUSR2 (what mpirun forwards), and --exit-signal.
// Without --save and --exit-signal-handler they keep their default action, as in Megatron.
std::vector<int> stop_signals(const TrainConfig& c) {
  if (c.save.empty() && !c.exit_signal_handler) return {};
  std::vector<int> s = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2};
  const int extra = StopSignals::parse(c.exit_signal);
  if (std::find(s.begin(), s.end(), extra) == s.end()) s.push_back(extra);
  return s;
}
// --eod-mask-loss: the tokenizer's end-of-document token (NullTokenizer: --vocab-size; HuggingFace: its EOS).
int64_t eod_mask_token(const TrainConfig& c, const Vocabulary& v) {
  if (!c.eod_mask_loss) return -1;
  if (c.tokenizer_type == "NullTokenizer") return c.vocab_size;
  MOE_CHECK(v.tokenizer && v.tokenizer->eos_id(),
            "--eod-mask-loss: the tokenizer in {} names no EOS token (tokenizer_config.json eos_token)",
            c.tokenizer_model);
  return *v.tokenizer->eos_id();
}
}  // namespace

void Trainer::request_stop(int signal) {
  StopSignals::request(signal);
}

namespace {
// The device this rank trains on (cuda:<local rank>, or the CPU) and how GPU tensors travel, agreed by every rank
// before any group exists (the groups' NCCL communicators are made with them); `placement` says so where several
// ranks were placed, `training_on` names a single process's GPU. A single process without a world: no groups.
Device place_this_rank(const TrainConfig& c, const comm::ProcessGroup* world, std::string* placement,
                       std::string* training_on) {
  if (world) return comm::place_ranks_on_gpus(c.device, "train", world->comm(), placement);
  if (!training_device(c).is_cuda()) return Device::cpu();
  const Device d = Device::cuda(device::place_on_gpu(0, 1, device::visible_devices(), c.device, false).device);
  device::set_current_device(d);
  *training_on = device::describe_device(d);
  return d;
}
}  // namespace

Trainer::Trainer(TrainConfig cfg, std::FILE* out, bool measure_peak, const comm::ProcessGroup* world)
    : cfg_(std::move(cfg)), timers_(std::make_unique<Timers>(static_cast<int>(cfg_.timing_log_level))), out_(out) {
  MOE_ASSERT_MSG(is_resolved(cfg_), "a configuration changed since train::resolve (or never resolved): resolve it");
  Timers::Install timing(timers_.get());
  std::string placement, training_on;
  device_ = place_this_rank(cfg_, world, &placement, &training_on);
  groups_ = std::make_unique<ParallelGroups>(cfg_, world);
  if (groups_->world_rank != 0) out_ = null_out_ = std::fopen("/dev/null", "w");  // one rank speaks
  if (groups_->world_rank != 0) moecore::Progress::silence_this_process();        // checkpoint progress too
  fmt::print(out_, "moecore train: resolved configuration\n{}", describe(cfg_));
  if (!placement.empty()) fmt::print(out_, "moecore train: {}\n", placement);
  if (groups_->mesh) fmt::print(out_, "{}", groups_->mesh->describe());
  StartPoint start = find_start_point(cfg_, groups_->world.get());
  vocab_ = build_vocabulary(cfg_, start.vocab_rows);
  eod_mask_token_ = eod_mask_token(cfg_, vocab_);
  check_memory_before_start(cfg_, vocab_.padded, *groups_, out_);  // refuses a run that cannot fit, before allocating
  timers_->start("train/valid/test-data-iterators-setup", 0);
  data_ = build_datasets(cfg_, vocab_.size);
  timers_->stop("train/valid/test-data-iterators-setup");
  timers_->start("model-and-optimizer-setup", 0);
  // --init-model-with-meta-device under FSDP's optim_grads_params over several ranks: the model is built without
  // its parameters' storage, and the optimizer makes and initialises each rank's shards
  // (optim/distributed_optimizer.h).
  const optim::OptimizerConfig oc = optimizer_config(cfg_);
  reg_.set_meta(oc.fsdp_init_shards && groups_->dp != nullptr);
  model_ = build_model(cfg_, vocab_.padded, reg_, *groups_);
  reg_.set_meta(false);
  {  // initialized on the host (the same values on every device), then moved as a whole
    MOE_ASSERT(training_device(cfg_).is_cuda() == device_.is_cuda());  // the GPU path's checks, on every rank
    reg_.to(device_);
    if (!training_on.empty()) fmt::print(out_, "moecore train: training on {}\n", training_on);
  }
  if (const OffloadConfig oc = offload_config(cfg_, device_); oc.modules.any()) {  // --offload-modules
    offload_ = std::make_unique<ActivationOffload>(oc, device_);
    model_->set_stash_offload(offload_.get());
  }
  stash_ = model_->make_stash();
  std::vector<nn::Parameter*> params;
  for (auto& p : reg_.all()) params.push_back(p.get());
  const size_t layers = static_cast<size_t>(cfg_.num_layers);  // buckets by global layer (any pipeline stage)
  optim::OptimizerGroups og{groups_->dp.get(), groups_->edp.get(), groups_->tp.get(), groups_->world.get(),
                            groups_->etp.get()};
  // Tied, or MTP (Megatron embeds the MTP inputs with the last stage's copy of the word embedding): shared copies.
  if (groups_->embedding && (!cfg_.untie_embeddings_and_output_weights || cfg_.mtp_num_layers > 0)) {
    og.embedding = groups_->embedding.get();
    og.shared_embedding = model_->word_embedding();
  }
  opt_ = std::make_unique<optim::ChainedOptimizer>(
      params, layers + 1, [layers](const nn::Parameter& p) { return layer_of(p, layers); }, og, oc);
  // --overlap-param-gather: every forward waits, layer by layer, for the all-gathers the last step left in flight.
  if (oc.overlap_param_gather || opt_->fsdp_units())
    model_->set_forward_pre_hook([o = opt_.get()](size_t b) {
      o->wait_param_gather(b);
      o->unit_forward(b);
    });
  // Megatron's fp16/bf16 main gradients: rounded as each micro-batch's backward writes them.
  if (opt_->rounds_grads())
    model_->set_grads_written_hook([o = opt_.get()](size_t b) { o->micro_batch_grads_done(b); });
  // Megatron FSDP (optim_grads and up): each unit's parameters and gradients gathered and freed around its use.
  if (opt_->fsdp_units()) {
    optim::ChainedOptimizer* o = opt_.get();
    model_->set_unit_hooks({[o](size_t b) { o->unit_prefetch(b); }, [o](size_t b) { o->unit_params_done(b); },
                            [o](size_t b) { o->unit_backward(b); }, [o](size_t b) { o->unit_backward_done(b); }});
  }
  if (groups_->pp_size > 1) {
    const int64_t v = virtual_stages(cfg_), m = micro_batches().count;
    // Megatron's micro-batch rules for interleaving, checked before the first step.
    pipeline_order(m, groups_->pp_size, groups_->pp_rank, v, cfg_.microbatch_group_size_per_vp_stage);
    const Shape hidden{cfg_.seq_length / (cfg_.tensor_model_parallel_size * groups_->cp_size), cfg_.micro_batch_size,
                       cfg_.hidden_size};
    // Megatron's combined 1F1B inside the interleaved schedule where it applies.
    auto p = std::make_unique<PipelineSchedule>(*groups_->pp, v, cfg_.microbatch_group_size_per_vp_stage, hidden,
                                                combined_1f1b(cfg_));
    p->set_device(device_);
    pipeline_ = p.get();
    schedule_ = std::move(p);
  } else {
    schedule_ = std::make_unique<NoPipelining>(combined_1f1b(cfg_));  // Megatron's combined 1F1B where it applies
  }
  ckpt_ = std::make_unique<CheckpointSaver>(cfg_, out_, *groups_, vocab_, reg_, *model_, opt_.get());
  progress_.schedule = lr_schedule(cfg_);  // the checkpoint's may replace it (--use-checkpoint-opt_param-scheduler)
  timers_->start("load-checkpoint", 0);
  loaded_from_ = load_at_start(*ckpt_, start, progress_, ckpt_.get());
  timers_->stop("load-checkpoint");
  if (!loaded_from_.empty()) log_timers({"load-checkpoint"});
  timers_->elapsed("load-checkpoint", true);
  timers_->stop("model-and-optimizer-setup");
  if (!loaded_from_.empty())
    check_parameters_finite(opt_->held_values(), "the model loaded from " + loaded_from_, groups_->world.get());
  stall_ = std::make_unique<StallAlarm>(vocab_.padded);
  health_ = std::make_unique<HealthAlarms>(cfg_, cfg_.expert_model_parallel_size);
  log_ = std::make_unique<MetricsLog>(cfg_, out_, groups_->world_rank == 0 ? cfg_.metrics_file : "",
                                      progress_.iteration > 0, ParallelGroups::size(groups_->world), groups_.get());
  tb_ = std::make_unique<TensorBoardLog>(cfg_, *groups_);
  log_->set_device(device_);
  tb_->set_device(device_);
  if (measure_peak) peak_gflops_ = kernels::measure_gemm_peak_gflops(cfg_.bf16 ? DType::BF16 : DType::F32, device_);
  plan_ = print_memory_plan(out_, cfg_, reg_, vocab_.size, vocab_.padded, *groups_);
  log_->set_planned_memory(plan_.total());
  startup_peak_ = Allocator::instance().stats().peak_bytes;
  Allocator::instance().reset_peak();  // the logged peak is training's, not start-up's (the GEMM peak's buffers)
  device::device_reset_peak(device_);  // nothing on the CPU
  log_timers({"model-and-optimizer-setup", "train/valid/test-data-iterators-setup"});
}

std::vector<TimerRow> Trainer::log_timers(const std::vector<std::string>& names, double normalizer, int64_t iteration) {
  const std::vector<TimerRow> rows = gather_timers(*timers_, names, groups_->world.get(), normalizer);
  if (rows.empty()) return rows;
  fmt::print(out_, "{}\n", format_timers(rows, cfg_.timing_log_option));
  if (iteration >= 0) log_->write_json(timers_record(rows, cfg_.timing_log_option, iteration));
  return rows;
}

void Trainer::level_1_barrier() const {
  if (cfg_.timing_log_level >= 1 && !cfg_.no_barrier_with_level_1_timing && groups_->distributed())
    groups_->world->barrier();
}

Trainer::~Trainer() {
  tb_.reset();  // the event file flushed and closed (also after a stop signal or an error)
  log_.reset();
  if (null_out_) std::fclose(null_out_);
}

// Kernels launch on the thread's current GPU: this trainer's (several trainers in one process may use different
// GPUs, as the layout tests' one-rank reference on GPU 0 beside a rank on cuda:<local rank>).
void Trainer::make_device_current() const {
  device::set_current_device(device_);  // nothing on the CPU
}

std::string Trainer::save_checkpoint() {
  make_device_current();
  opt_->finish_param_gather();  // the parameters whole on every rank before they are read
  check_parameters_finite(opt_->held_values(), fmt::format("refusing to save iteration {}", progress_.iteration),
                          groups_->world.get());
  Timers::Install timing(timers_.get());
  timers_->start("save-checkpoint", 0);
  std::string dir = ckpt_->save(progress_);
  timers_->stop("save-checkpoint");
  log_timers({"save-checkpoint"});
  return dir;
}

double Trainer::step_flops() const {
  return train::step_flops(cfg_, vocab_.padded);
}

std::map<std::string, double> Trainer::analytic_comm_bytes() const {
  return train::analytic_comm_bytes(cfg_, reg_, *groups_);
}

MicroBatches Trainer::micro_batches() const {
  MicroBatches mb{cfg_.global_batch_size / (cfg_.micro_batch_size * groups_->dp_size), cfg_.micro_batch_size,
                  groups_->dp_rank, groups_->dp_size};
  mb.eod_mask_token = eod_mask_token_;
  mb.per_token_loss = cfg_.calculate_per_token_loss;
  mb.dp = ParallelGroups::active(groups_->dp);
  mb.cp_size = groups_->cp_size;
  mb.loss_scale = opt_ ? opt_->loss_scale() : 1.0f;
  return mb;
}

StepResult Trainer::train_step(bool read_norm) {
  make_device_current();
  MOE_ASSERT(data_[0]);
  maybe_stall(cfg_, groups_->world_rank, progress_.iteration);  // --testing-stall
  StepResult r;
  kernels::set_id_check_iteration(progress_.iteration + 1);  // the GPU's deferred id checks name the step
  // Megatron's OptimizerParamScheduler: learning rate and weight decay after schedule_steps samples.
  r.lr = progress_.schedule.lr(progress_.schedule_steps);
  opt_->set_weight_decay(progress_.schedule.wd(progress_.schedule_steps));
  // Lazily on the host: the step's first weight-gradient GEMMs overwrite last step's gradients (beta 0) instead of
  // adding into zeros, and no pass zeroes them; what no backward wrote is zeroed below (Parameter::grad_stale).
  reg_.zero_grad(/*lazy=*/true);
  Timers::Install timing(timers_.get());
  level_1_barrier();
  timers_->start("forward-backward", 1);
  const double t0 = now_seconds();
  StepLoss loss;
  {
    // Weights change only after the micro-batches: rounded (and packed) once for all of them.
    nn::Bf16WeightScope bf16_scope(reg_, cfg_.bf16 && kernels::pack_weights_for(micro_batches().count));
    loss = schedule_->forward_backward(*model_, stash_, *data_[0], progress_.cursor, micro_batches(), *opt_);
  }
  reg_.settle_grads();
  const double t1 = now_seconds();
  timers_->stop("forward-backward");
  level_1_barrier();
  timers_->start("optimizer", 1);
  r.forward_backward_seconds = t1 - t0;
  const data::SampleCursor step_cursor = progress_.cursor;
  progress_.cursor.advance(cfg_.global_batch_size);
  if (groups_->distributed()) {  // the reported loss: over the loss tokens of the whole global batch, as Megatron
    Tensor t = Tensor::empty({2}, DType::F64);
    t.set_item(0, loss.sum);
    t.set_item(1, loss.tokens);
    groups_->dp->all_reduce(t);
    loss = {t.item(0), t.item(1)};
  }
  r.lm_loss = loss.tokens > 0 ? loss.sum / loss.tokens : 0.0;
  // One global norm over dense and expert gradients; the run control rides along (a stop signal seen by any rank,
  // --exit-duration-in-mins passed, this rank's background save written), so every rank decides alike here.
  const int mine = StopSignals::requested();
  const bool late =
      cfg_.exit_duration_in_mins > 0 && minutes_since_process_start() > static_cast<double>(cfg_.exit_duration_in_mins);
  auto riders = StopRiders::of_rank(mine, late, ckpt_->async_written()).packed();
  const std::optional<double> norm = opt_->finish_gradients(riders, progress_.iteration + 1);
  r.grad_norm = norm.value_or(0.0);
  r.grad_norm_on_device = !norm.has_value();
  const StopRiders all = StopRiders::unpacked(riders);
  if (const int s = all.stop_signal(mine)) stop_signal_ = s;
  duration_exit_ = all.past_duration();
  const bool async_written =
      ckpt_->async_pending() && all.async_written_everywhere(ParallelGroups::size(groups_->world));
  // Loss scaling: the scale after the scaler's update (Megatron logs it), and whether the step is skipped.
  r.loss_scale = opt_->loss_scale();
  r.skipped = opt_->skipped();
  // Megatron's --check-for-nan-in-loss-and-grad (on by default, off under dynamic loss scaling); without it the step
  // is applied (routing_health), or skipped by a loss scaler. A norm still on the GPU is checked there: the update
  // kernels skip the step, and settle_norms stops.
  if (check_nan_in_loss_and_grad(cfg_) && (!std::isfinite(r.grad_norm) || !std::isfinite(r.lm_loss)))
    stop_nonfinite(progress_.iteration + 1, r.lm_loss, r.grad_norm, step_cursor, 0);
  // Once per global batch, after gradients are final: expert-bias counts summed over TP×DP×CP and the bias
  // updated, routing statistics of the step snapshotted, counters reset.
  model_->finish_global_batch();
  progress_.iteration++;
  const double decoupled_lr =
      cfg_.decoupled_lr >= 0 ? decoupled_lr_schedule(cfg_, progress_.schedule).lr(progress_.schedule_steps) : -1.0;
  // Adam's step count: the updates applied (a skipped step advances neither it nor the learning-rate schedule).
  if (r.skipped) progress_.skipped_iterations++;
  opt_->step(r.lr, progress_.iteration - progress_.skipped_iterations, decoupled_lr);
  r.optimizer_seconds = now_seconds() - t1;
  timers_->stop("optimizer");
  if (!r.skipped) progress_.schedule_steps += cfg_.global_batch_size;  // Megatron's increment: the step's samples
  router_losses(cfg_, *model_, *groups_, r);
  mtp_losses(cfg_, *model_, *groups_, r);                 // --mtp-num-layers
  if (cfg_.log_params_norm) opt_->finish_param_gather();  // the norm reads whole f32 parameters
  param_stats(cfg_, reg_, *groups_, opt_.get(), r);       // --log-params-norm
  r.num_zeros = opt_->num_zeros_in_grad();   // --log-num-zeros-in-grad: counted as the gradients were reduced
  if (async_written) ckpt_->finish_async();  // every rank's files are written: the save becomes visible
  if (!r.grad_norm_on_device) return r;
  deferred_.push_back({r, progress_.iteration, step_cursor});
  return read_norm ? settle_norms().back() : r;
}

std::vector<StepResult> Trainer::settle_norms() {
  std::vector<StepResult> out;
  kernels::raise_deferred_id_checks();  // a bad token id or label first: it also stopped the GPU's updates
  if (deferred_.empty()) return out;
  const kernels::DeferredNorms d = opt_->take_norms();  // one read-back: the norms and the skip flag
  MOE_ASSERT(d.norms.size() == deferred_.size());
  std::vector<DeferredStep> steps;
  steps.swap(deferred_);
  for (size_t i = 0; i < steps.size(); i++) {
    steps[i].r.grad_norm = d.norms[i];
    steps[i].r.grad_norm_on_device = false;
  }
  for (size_t i = 0; i < steps.size() && d.first_nonfinite > 0; i++)
    if (steps[i].iteration == d.first_nonfinite)
      stop_nonfinite(steps[i].iteration, steps[i].r.lm_loss, steps[i].r.grad_norm, steps[i].cursor,
                     static_cast<int64_t>(steps.size() - 1 - i));
  MOE_ASSERT_MSG(d.first_nonfinite == 0, "the GPU skipped from iteration {}, a step not read here", d.first_nonfinite);
  for (auto& s : steps) out.push_back(std::move(s.r));
  return out;
}

void Trainer::stop_nonfinite(int64_t iteration, double lm_loss, double grad_norm, const data::SampleCursor& cursor,
                             int64_t not_applied_after) {
  const std::string where =
      pipeline_ ? locate_nonfinite_pipeline(*model_, reg_, opt_->held_values(), *pipeline_, *data_[0], cursor,
                                            micro_batches(), *groups_->world, groups_->pp_rank, groups_->pp_size)
                : locate_nonfinite(*model_, stash_, reg_, opt_->held_values(), *data_[0], cursor, micro_batches(),
                                   groups_->world.get());
  const std::string later =
      not_applied_after > 0
          ? fmt::format(" (nor the {} after it, which ran before the GPU's norm was read at iteration {})",
                        not_applied_after, iteration + not_applied_after)
          : "";
  const std::string m = fmt::format(
      "iteration {}: the {} is not finite (lm loss {}, gradient norm {}).\nThe first non-finite value of the "
      "step: {}.\nThe step was not applied{} and nothing was saved{}.",
      iteration, std::isfinite(lm_loss) ? "gradient norm" : "loss", lm_loss, grad_norm, where, later,
      ckpt_->last_saved() >= 0 ? fmt::format("; the last checkpoint is iteration {}", ckpt_->last_saved()) : "");
  log_->write_json({{"alarm", "nan"}, {"iteration", iteration}, {"action", "stop"}, {"message", m}});
  MOE_CHECK(false, "{}", m);
  std::abort();  // unreachable: MOE_CHECK(false) throws
}

bool Trainer::must_settle(int64_t it) const {
  const auto every = [it](int64_t n) { return n > 0 && it % n == 0; };
  return every(cfg_.log_interval) || it >= cfg_.train_iters ||
         (!cfg_.tensorboard_dir.empty() && every(cfg_.tensorboard_log_interval)) ||
         !check_nan_in_loss_and_grad(cfg_) ||  // the health alarm's per-step non-finite warning
         (!cfg_.save.empty() && every(cfg_.save_interval)) || every(cfg_.exit_interval) || stop_signal_ != 0 ||
         duration_exit_ || opt_->deferred_full();
}

double Trainer::evaluate(int64_t iters) {
  make_device_current();
  MOE_CHECK(data_[1], "no validation data: --split {} gives the valid split no documents", cfg_.split);
  Timers::Install timing(timers_.get());
  timers_->start("evaluate", 0);
  model_->set_training(false);
  nn::Bf16WeightScope bf16_scope(reg_);
  double sum = 0, tokens = 0;  // Megatron: the loss over the loss tokens of all evaluated batches
  data::SampleCursor c;
  for (int64_t it = 0; it < iters && pipeline_; it++) {  // pipeline: forward passes through the stages
    const int64_t mbs = cfg_.micro_batch_size;
    const StepLoss l = pipeline_->forward_only(
        *model_, *data_[1], [&c, mbs](int64_t m) { return c.micro_batch(m, 0, 1, mbs); }, cfg_.global_batch_size / mbs,
        eod_mask_token_);
    sum += l.sum;
    tokens += l.tokens;
    c.advance(cfg_.global_batch_size);
  }
  for (int64_t it = 0; it < iters && !pipeline_; it++) {
    for (int64_t m = 0; m < cfg_.global_batch_size / cfg_.micro_batch_size; m++) {
      const data::Batch b = data::make_batch(*data_[1], c.micro_batch(m, 0, 1, cfg_.micro_batch_size), eod_mask_token_);
      sum += model_->forward(b.tokens, b.labels, b.loss_mask, stash_) * stash_.mask_sum;
      tokens += stash_.mask_sum;
    }
    c.advance(cfg_.global_batch_size);
  }
  model_->set_training(true);
  kernels::raise_deferred_id_checks();  // the validation data's ids, checked on the GPU
  stash_ = model_->make_stash();        // forward-only passes leave stashes filled; start the next step clean
  if (groups_->cp_size > 1) {           // context parallelism: each CP rank holds its chunks' losses
    Tensor t = Tensor::empty({2}, DType::F64);
    t.set_item(0, sum);
    t.set_item(1, tokens);
    groups_->cp->all_reduce(t);
    sum = t.item(0);
    tokens = t.item(1);
  }
  timers_->stop("evaluate");
  log_timers({"evaluate"});
  return tokens > 0 ? sum / tokens : 0.0;
}

std::string Trainer::generate(const std::string& prompt, int64_t n, double temperature, int64_t top_k, uint64_t seed) {
  make_device_current();
  MOE_CHECK(vocab_.tokenizer, "generation needs --tokenizer-type HuggingFaceTokenizer");
  return generate_text(*model_, *vocab_.tokenizer, vocab_.size, prompt, {n, temperature, top_k, seed, cfg_.seq_length});
}

double Trainer::unigram_entropy() const {
  MOE_ASSERT(data_[0]);
  std::vector<int64_t> counts(static_cast<size_t>(vocab_.padded), 0);
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

void Trainer::train_loop() {
  // Under mpirun a rank's stdout is a pty even when the job's output goes to a file, so the redrawn progress
  // line is only shown by a single process; multi-rank runs log every --log-interval steps.
  const bool tty = ::isatty(fileno(out_)) != 0 && !groups_->distributed();
  int64_t& it = progress_.iteration;
  fmt::print(out_,
             "training {} iterations of {} sequences x {} tokens ({} data-parallel rank(s) x {} micro-batches of {})\n",
             cfg_.train_iters - it, cfg_.global_batch_size, cfg_.seq_length, groups_->dp_size, micro_batches().count,
             cfg_.micro_batch_size);
  const double t_start = now_seconds();
  const int64_t first = it;
  double t_interval = t_start;
  const std::string resume = cfg_.save.empty() ? "" : fmt::format("; resume with --load {}", cfg_.save);
  while (it < cfg_.train_iters) {
    StepResult r = train_step(/*read_norm=*/false);
    // The steps whose norms are on the host now: this one, or on one GPU those read at this step (the norms wait
    // in device memory between log lines, so the optimizer never waits for the host).
    std::vector<StepResult> settled;
    if (!r.grad_norm_on_device) {
      settled.push_back(r);
      if (must_settle(it)) settle_norms();  // the deferred id checks (multi-rank GPU runs; none on the CPU)
    } else if (must_settle(it)) {
      r = (settled = settle_norms()).back();
    }
    for (const StepResult& s : settled) progress_.sums.add(s);
    log_->after_step(r);
    Scalars extra;  // Megatron's params-norm and num-zeros tags follow its log flags
    if (cfg_.log_params_norm) extra.emplace_back("params-norm", r.params_norm);
    if (cfg_.log_num_zeros_in_grad) extra.emplace_back("num-zeros", static_cast<double>(r.num_zeros));
    tb_->after_step(it, progress_.cursor.consumed_samples, r, *model_, extra);
    // Routing and loss health (routing_health.h): warns, or stops every rank here before this step is saved.
    run_health_alarms(*health_, it, r, *model_, *groups_, *log_, out_, tty, cfg_.logging_level, ckpt_->last_saved());
    if (cfg_.check_weight_hash_across_dp_replicas_interval > 0 &&
        it % cfg_.check_weight_hash_across_dp_replicas_interval == 0) {
      opt_->finish_param_gather();
      check_weight_hashes_across_dp(reg_, *groups_, it);
    }
    // Warnings are Python logging's WARNING (30) in Megatron: shown unless --logging-level is above it.
    for (const StepResult& s : settled)
      if (const auto warning = stall_->after_step(s); warning && cfg_.logging_level <= 30) {
        if (tty) fmt::print(out_, "\r\033[K");
        fmt::print(out_, "{}\n", *warning);
      }
    if (tty) {  // one redrawn line on a terminal (train/metrics: progress_line); logs keep their lines only
      const double el = now_seconds() - t_start, done = static_cast<double>(it - first);
      const double tps = done * static_cast<double>(cfg_.global_batch_size * cfg_.seq_length) / el;
      fmt::print(
          out_, "\r\033[K{}",
          progress_line(it, cfg_.train_iters, r.lm_loss, tps, el / done * static_cast<double>(cfg_.train_iters - it)));
      std::fflush(out_);
    }
    if (it % cfg_.log_interval == 0 || it == cfg_.train_iters) {
      if (tty) fmt::print(out_, "\r\033[K");
      const double secs = now_seconds() - t_interval, steps = static_cast<double>(progress_.sums.iterations());
      log_->log_interval(it, progress_.cursor.consumed_samples, r, progress_.sums, secs, step_flops(), peak_gflops_,
                         *model_);
      // Megatron's timers of --timing-log-level after the log line, per iteration of the interval (collective).
      tb_->at_log_interval(it, secs / steps, log_timers(logged_timer_names(timers_->log_level()), steps, it));
      t_interval = now_seconds();
    }
    if (cfg_.eval_iters > 0 && data_[1] && it % cfg_.eval_interval == 0 && it < cfg_.train_iters) {
      const double v = evaluate(cfg_.eval_iters);
      log_->log_validation(it, v);
      tb_->validation(it, progress_.cursor.consumed_samples, v);
      t_interval = now_seconds();
    }
    const bool exit_now = cfg_.exit_interval > 0 && it % cfg_.exit_interval == 0;
    if (!cfg_.save.empty() &&
        ((cfg_.save_interval > 0 && it % cfg_.save_interval == 0) || exit_now || stop_signal_ != 0 || duration_exit_)) {
      if (tty) fmt::print(out_, "\r\033[K");
      save_checkpoint();
      t_interval = now_seconds();
    }
    if (stop_signal_ != 0 || duration_exit_ || exit_now) ckpt_->finish_async();  // a save in flight completes
    if (stop_signal_ != 0) {
      fmt::print(out_, "stopping at iteration {} on {}{}\n", it, StopSignals::name(stop_signal_), resume);
      return;
    }
    if (duration_exit_) {
      fmt::print(out_, "exiting at iteration {} after {:.2f} minutes (--exit-duration-in-mins {}){}\n", it,
                 minutes_since_process_start(), cfg_.exit_duration_in_mins, resume);
      return;
    }
    if (exit_now) {
      fmt::print(out_, "exiting at iteration {} (--exit-interval {}){}\n", it, cfg_.exit_interval, resume);
      return;
    }
  }
  if (!cfg_.save.empty() && ckpt_->last_saved() != it) save_checkpoint();
  ckpt_->finish_async();
  final_report();
}

void Trainer::final_report() {
  if (cfg_.eval_iters > 0 && data_[1]) {
    const double v = evaluate(cfg_.eval_iters);
    log_->log_validation(progress_.iteration, v);
    tb_->validation(progress_.iteration, progress_.cursor.consumed_samples, v);
    if (data_[0]) {
      const double h = unigram_entropy();
      fmt::print(out_, "final validation loss {:.4f} nats vs unigram entropy of the training data {:.4f} nats ({})\n",
                 v, h,
                 v < h ? "the model uses context" : "NOT below the unigram entropy: train longer or check the data");
    }
  }
  print_expert_load(out_, *model_, groups_->distributed());
  if (!cfg_.generate_prompts.empty() && vocab_.tokenizer) {
    const uint64_t seed = static_cast<uint64_t>(cfg_.seed);
    for (const auto& p : cfg_.generate_prompts) {
      fmt::print(out_, "--- greedy: {}\n", generate(p, cfg_.generate_tokens, 0.0, 0, seed));
      fmt::print(out_, "--- sampled (temperature {}, top-k {}): {}\n", cfg_.generate_temperature, cfg_.generate_top_k,
                 generate(p, cfg_.generate_tokens, cfg_.generate_temperature, cfg_.generate_top_k, seed));
    }
  }
}

void Trainer::run() {
  // A SIGCONT that resumes nothing starts the stop too (signals.h: mpirun's kill sequence), unless --exit-signal
  // claims SIGCONT for itself.
  const std::vector<int> handled = stop_signals(cfg_);
  StopSignals signals(handled, !handled.empty() && StopSignals::parse(cfg_.exit_signal) != SIGCONT);
  if (cfg_.skip_train) {
    final_report();
    return;
  }
  if (progress_.iteration >= cfg_.train_iters) {
    fmt::print(out_, "the checkpoint is at iteration {}, --train-iters is {}: nothing to train\n", progress_.iteration,
               cfg_.train_iters);
    final_report();
    return;
  }
  train_loop();
}

}  // namespace moecore::train
