// The rules for Megatron-LM's flags, continued (see megatron_flag_rules.cpp): numerics, implementation selectors,
// communication, data and tokenizers, logging and profiling, resilience, model features, MoE, and the areas that
// are not GPT pretraining.
#include "moecore/train/config/megatron_flag_rule_builders.h"

namespace moecore::train {
namespace {

using namespace rule_builders;  // NOLINT(build/namespaces): the rule tables read as prose
constexpr const char* kEagerSteps =
    "moecore launches every step eagerly on the CPU and the GPU (no CUDA graph capture, which never changes the math); "
    "Megatron's rules on the flag are checked";

std::string not_gpt(const std::string& area) {
  return area + " is not a GPT pretraining feature: not supported by moecore";
}

void numerics(std::vector<FlagRule>& r) {
  r.push_back(
      no_effect("fp32 refinements of fp16/bf16 main gradients: moecore accumulates and reduces those in their own "
                "dtype (docs/differences.md), fp32 ones in fp32",
                {"ddp-reduce-scatter-with-fp32-accumulation", "ddp-param-name-patterns-for-fp32-local-accumulation",
                 "gtp-remat-reduce-scatter-with-fp32-accumulation"}));
  r.push_back(no_effect_for({"main-params-dtype"}, {"fp32"}, "moecore's master weights are fp32",
                            "lower-precision master weights are not supported by moecore "
                            "(bf16 Adam moments are: --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)"));
  r.push_back(no_effect("moecore computes the attention softmax in fp32 always", {"attention-softmax-in-fp32"}));
  r.push_back(
      no_effect("scales Q·Kᵀ down by the layer number and the fp32 softmax back up: the same attention up "
                "to rounding (an fp16 safeguard)",
                {"apply-query-key-layer-scaling"}));
  r.push_back(no_effect("moecore's bf16 GEMMs accumulate in fp32 always", {"disable-bf16-reduced-precision-matmul"}));
  r.push_back(
      no_effect("moecore keeps the residual stream in fp32 always, under --bf16 and --fp16 too (what this flag "
                "asks of Megatron)",
                {"fp32-residual-connection"}));
  r.push_back(no_effect_for({"output-logit-dtype"}, {"fp32"}, "moecore's output layer produces fp32 logits",
                            "bf16 logits are not supported by moecore"));
  r.push_back(refused(unsupported("batch-invariant kernels"), {"batch-invariant-mode"}));
  r.push_back(no_effect("acts only with --batch-invariant-mode (refused in moecore)", {"batch-invariant-backend"}));
}

void selectors(std::vector<FlagRule>& r) {
  r.push_back(no_effect(
      "a kernel fusion: moecore computes the same math unfused or fused its own way",
      {"no-gradient-accumulation-fusion", "no-rope-fusion", "no-bias-swiglu-fusion", "no-bias-gelu-fusion",
       "no-bias-dropout-fusion", "no-masked-softmax-fusion", "no-persist-layer-norm", "no-gradient-reduce-div-fusion",
       "moe-permute-fusion", "moe-permute-fusion-into-hybridep", "moe-router-fusion", "cross-entropy-loss-fusion",
       "cross-entropy-fusion-impl", "fused-residual-rmsnorm", "use-fused-weighted-squared-relu", "disable-jit-fuser",
       "use-transformer-engine-op-fuser", "use-te-activation-func"}));
  r.push_back(no_effect("selects Megatron's model code (Megatron Core here); moecore has one implementation",
                        {"use-mcore-models"}));
  r.push_back(
      refused(unsupported("Megatron's legacy (non-Core) models", "drop the flag: moecore follows Megatron Core"),
              {"use-legacy-models"}));
  r.push_back(no_effect_for({"transformer-impl"}, {"local", "transformer_engine"},
                            "selects Megatron's layer implementation; moecore has one with the same math",
                            "the inference-optimized implementation is not a training feature"));
  r.push_back(no_effect_for({"attention-backend"}, {"flash", "fused", "unfused", "local", "auto"},
                            "selects Megatron's attention kernel; moecore has its own with the same math",
                            "not an attention backend"));
  r.push_back(no_effect("selects Megatron's attention kernel; moecore has its own with the same math",
                        {"use-flash-attn", "flash-attention-version"}));
  r.push_back(
      no_effect("moecore is always deterministic (fixed reduction orders, counter-based RNG)", {"deterministic-mode"}));
  r.push_back(
      no_effect("selects Megatron's GPU random-number tracker; moecore's RNG is counter-based", {"te-rng-tracker"}));
  // CUDA graphs: moecore launches every step eagerly on both devices, and a capture never changes the math; Megatron's
  // rules on these flags are refused as Megatron refuses them (config_validate_cuda_graph.cpp).
  r.push_back(no_effect_for({"cuda-graph-impl"}, {"none", "local", "transformer_engine", "full_iteration"}, kEagerSteps,
                            "not a CUDA graph implementation of Megatron's"));
  r.push_back(no_effect(
      std::string("Megatron's deprecated spellings of --cuda-graph-impl local and transformer_engine; ") + kEagerSteps,
      {"enable-cuda-graph", "external-cuda-graph"}));
  r.push_back(
      no_effect_for({"cuda-graph-modules", "cuda-graph-scope"},
                    {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full", "full_iteration",
                     "full_iteration_inference"},
                    std::string("what a CUDA graph captures (--cuda-graph-scope: its deprecated name); ") + kEagerSteps,
                    "not a CUDA graph module of Megatron's"));
  r.push_back(
      no_effect(std::string("steps run before a CUDA graph capture; ") + kEagerSteps, {"cuda-graph-warmup-steps"}));
  r.push_back(
      no_effect("captures the optimizer step in a CUDA graph (capturable Adam, the same math); moecore launches "
                "every step eagerly",
                {"optimizer-cuda-graph"}));
  r.push_back(
      no_effect("GPU memory and stream management: moecore plans its own memory on the CPU engine",
                {"empty-unused-memory-level", "use-cpu-initialization", "high-priority-a2a-comm-stream",
                 "high-priority-stream-groups", "use-nccl-ub", "disable-symmetric-registration", "gtp-remat-nccl-ub",
                 "gtp-expert-remat-nccl-ub", "gtp-remat-opt-in-modules", "ep-overlap-early-attn-memory-release",
                 "moe-paged-stash", "moe-paged-stash-buffer-size-factor-cpu", "moe-paged-stash-buffer-size-factor-cuda",
                 "moe-paged-stash-page-size", "disable-clone-scatter-output-in-embedding",
                 "no-clone-scatter-output-in-embedding", "train-sync-interval", "enable-experimental"}));
  r.push_back(no_effect("moecore keeps the optimizer state in host memory already (same AdamW)",
                        {"optimizer-cpu-offload", "optimizer-offload-fraction", "use-torch-optimizer-for-cpu-offload",
                         "overlap-cpu-optimizer-d2h-h2d"}));
  r.push_back(no_effect("Python garbage collection",
                        {"manual-gc", "manual-gc-interval", "disable-manual-gc-eval", "no-manual-gc-eval"}));
  r.push_back(no_effect_for({"mlp-chunks-for-training"}, {"1"}, "moecore computes the MLP in one piece",
                            "chunking the MLP along the sequence (a memory saver) is not supported by moecore"));
  r.push_back(no_effect_for({"tensor-parallel-num-weight-shards", "expert-tensor-parallel-num-weight-shards"}, {"1"},
                            "weight shards beyond tensor parallelism: none",
                            "weight rematerialization across extra shards is not supported by moecore"));
}

void communication(std::vector<FlagRule>& r) {
  r.push_back(no_effect(
      "overlaps or schedules communication with computation: the same math, moecore schedules "
      "its own",
      {"no-async-tensor-model-parallel-allreduce", "disable-align-grad-reduce", "no-align-grad-reduce",
       "no-align-param-gather", "defer-embedding-wgrad-compute", "wgrad-deferral-limit", "create-all-gather-group",
       "ddp-num-buckets", "ddp-pad-buckets-for-high-nccl-busbw", "ddp-average-in-collective"},
      {"tp-comm-", "disable-tp-comm-", "no-tp-comm-"}));
  r.push_back(
      no_effect("moecore chooses the transport itself: NCCL between GPUs when every rank owns its GPU, MPI "
                "for host tensors and host-staged MPI where ranks share a GPU",
                {"distributed-backend"}));
  r.push_back(
      no_effect("moecore takes the local rank from MPI's shared-memory split (MPI_COMM_TYPE_SHARED) and trains on "
                "cuda:<local rank>, as Megatron's LOCAL_RANK",
                {"local-rank"}));
  r.push_back(no_effect(
      "a process-group or communicator setting: moecore makes its MPI groups and NCCL communicators itself "
      "(one per group, from MPI, at group construction)",
      {"disable-gloo-process-groups", "nccl-communicator-config-path", "use-sharp", "sharp-enabled-group",
       "symmetric-ar-type", "lazy-mpu-init", "distributed-timeout-seconds-after-init", "use-tp-pp-dp-mapping"}));
  r.push_back(no_effect(
      "a dispatcher backend's tuning or a kernel choice (SM counts, HybridEP blocks, grouped-GEMM forms): the same "
      "routing and expert math (--moe-flex-dispatcher-backend selects flex's backend: deepep and hybridep have the "
      "same math in moecore)",
      {"moe-deepep-num-sms", "moe-flex-dispatcher-num-sms", "moe-ncclep-zero-copy", "moe-use-legacy-grouped-gemm",
       "moe-use-grouped-tensor", "moe-single-grouped-bias", "moe-single-grouped-weight",
       "use-grouped-gemm-for-dense-mlp", "use-grouped-gemm-for-shared-expert"},
      {"moe-hybridep-"}));
  r.push_back(no_effect_for({"moe-dispatch-fwd-dtype", "moe-combine-bwd-dtype"}, {"bf16"},
                            "the dispatch wire dtype of the NCCL EP dispatcher; moecore sends activations unrounded",
                            "mxfp8 dispatch is not supported by moecore"));
  r.push_back(refused(unsupported("the model-parallel-size alias", "use --tensor-model-parallel-size"),
                      {"model-parallel-size"}));
  r.push_back(refused(unsupported("a fake process group (no real communication)"), {"fake-process-group"}));
}

void data_and_tokenizers(std::vector<FlagRule>& r) {
  r.push_back(no_effect("data-loading mechanics: moecore reads the same samples its own way",
                        {"num-workers", "no-mmap-bin-files", "no-create-attention-mask-in-dataloader",
                         "dataloader-defer-npy-index-mmap", "dataloader-fast-cache-load", "num-dataset-builder-threads",
                         "data-cache-path", "exit-signal-handler-for-dataloader", "object-storage-cache-path",
                         "enable-msc", "disable-msc", "no-data-sharding"}));
  r.push_back(no_effect_for({"dataloader-type"}, {"single"}, "moecore's sampler is Megatron's single sampler",
                            "cyclic or external data loaders are not supported by moecore"));
  r.push_back(no_effect_for({"mid-level-dataset-surplus"}, {"0.005"}, "Megatron's default blending surplus",
                            "another blending surplus is not supported by moecore"));
  r.push_back(
      refused(unsupported("this data option", "use --data-path (with weights) and --split"),
              {"data-args-path", "per-split-data-args-path", "train-data-path", "valid-data-path", "test-data-path",
               "per-dataset-sequences-path", "sample-rate", "phase-transition-iterations", "multiple-validation-sets",
               "validation-set-names", "allow-ambiguous-pad-tokens", "iterations-to-skip"}));
  r.push_back(refused(unsupported("this change to what the model sees or is scored on"),
                      {"reset-attention-mask", "reset-position-ids", "dataloader-inter-document-masking"}));
  r.push_back(refused(unsupported("fill-in-the-middle (FIM) data"), {}, {"fim-"}));
  r.push_back(
      no_effect("read only by tokenizer types moecore refuses (--tokenizer-type accepts HuggingFaceTokenizer, "
                "GPT2BPETokenizer and NullTokenizer)",
                {"tokenizer-sentencepiece-legacy", "disable-tokenizer-sentencepiece-ignore-extra-whitespaces",
                 "no-tokenizer-sentencepiece-ignore-extra-whitespaces"},
                {"tiktoken-"}));
  r.push_back(no_effect("selects Megatron's tokenizer code; moecore has its own with the same tokens",
                        {"legacy-tokenizer", "tokenizer-hf-no-use-fast", "use-gigatoken", "trust-remote-code"}));
  r.push_back(refused(unsupported("this tokenizer option"),
                      {"tokenizer-hf-no-include-special-tokens", "tokenizer-metadata", "tokenizer-special-tokens",
                       "null-tokenizer-eod-id", "null-tokenizer-pad-id", "chat-template"}));
  r.push_back(refused(unsupported("an unpadded vocabulary",
                                  "use --make-vocab-size-divisible-by 1, or --padded-vocab-size with the exact rows"),
                      {"disable-pad-vocab-size", "no-pad-vocab-size"}));
}

void logging_and_resilience(std::vector<FlagRule>& r) {
  r.push_back(
      refused("Weights & Biases output is not supported; moecore logs to stdout, --metrics-file and "
              "--tensorboard-dir",
              {"log-device-memory-used"}, {"wandb-"}));
  r.push_back(refused(
      unsupported("this logging or dump",
                  "moecore logs losses, norms and timings to stdout and "
                  "--metrics-file"),
      {"log-energy", "log-max-attention-logit", "log-memory-interval", "log-progress", "log-straggler",
       "config-logger-dir", "dump-param-to-param-group-map", "save-activations-interval", "save-dgrads-interval",
       "save-params-interval", "save-wgrads-interval", "save-tokens-per-expert-interval"},
      {"moe-routing-trace-"}));
  r.push_back(no_effect(
      "profiling and telemetry switches: they observe the run, not its math",
      {"profile", "profile-ranks", "profile-step-start", "profile-step-end", "use-pytorch-profiler",
       "pytorch-profiler-collect-callstack", "pytorch-profiler-collect-chakra", "pytorch-profiler-collect-shapes",
       "record-shapes", "record-memory-history", "memory-snapshot-path", "nvtx-ranges", "run-workload-inspector-server",
       "no-one-logger", "app-tag-run-name", "app-tag-run-version", "gpu-sniff-test-interval",
       "disable-straggler-on-startup", "onnx-safe"},
      {"one-logger-", "otel-", "straggler-", "flight-recorder-", "disable-flight-recorder-", "no-flight-recorder-"}));
  r.push_back(
      no_effect("fault-tolerance heartbeats of nvidia-resiliency-ext (moecore stops every rank on a failure; "
                "resume from the last checkpoint)",
                {"enable-ft-package", "calc-ft-timeouts", "ft-num-warmup-iters"}));
  r.push_back(refused(unsupported("in-process restart", "moecore stops every rank on a failure; resume with --load"),
                      {"inprocess-restart"}));
  r.push_back(no_effect("acts only with --inprocess-restart (refused in moecore)", {}, {"inprocess-"}));
  r.push_back(refused(unsupported("ADLR autoresume", "use --exit-signal-handler (moecore saves and stops on a signal)"),
                      {"adlr-autoresume", "adlr-autoresume-interval"}));
  r.push_back(no_effect_for({"rerun-mode"}, {"disabled", "validate_results"},
                            "moecore stops on a non-finite loss or gradient, after re-running the step to name where "
                            "it appeared (docs/differences.md)",
                            "statistics on the variability of re-run iterations are not supported by moecore"));
  r.push_back(refused(
      unsupported("result validation and fault injection"),
      {"check-for-large-grads", "error-injection-rate", "error-injection-type", "result-rejected-tracker-filename"},
      {"fault-injector-"}));
  r.push_back(refused(unsupported("this training option"),
                      {"exit-signal-handler-for-training", "decrease-batch-size-if-needed", "step-batch-size-schedule",
                       "eval-global-batch-size", "eval-micro-batch-size", "full-validation", "start-eval-at-iter",
                       "freeze-all-layers", "head-lr-mult", "no-weight-decay-cond-type", "apply-wd-to-qk-layernorm",
                       "data-parallel-random-init", "test-mode", "spec", "yaml-cfg"}));
  r.push_back(refused(unsupported("the legacy --batch-size", "use --micro-batch-size"), {"batch-size"}));
  r.push_back(refused(unsupported("the legacy --warmup", "use --lr-warmup-iters"), {"warmup"}));
  r.push_back(no_effect("acts only with --optimizer lion (refused in moecore)", {"lion-beta1", "lion-beta2"}));
}

void model_features(std::vector<FlagRule>& r) {
  r.push_back(refused(unsupported("this architecture change"),
                      {"apply-residual-connection-post-layernorm",
                       "add-qkv-bias",
                       "attention-output-gate",
                       "activation-func-clamp-value",
                       "glu-linear-offset",
                       "openai-gelu",
                       "quick-geglu",
                       "qk-l2-norm",
                       "init-method-xavier-uniform",
                       "embedding-init-method-std",
                       "rotary-interleaved",
                       "use-rope-scaling",
                       "mrope-section",
                       "no-rope-freq",
                       "window-size",
                       "window-attn-skip-freq",
                       "enable-mhc-connections",
                       "heterogeneous-layers-config-path",
                       "heterogeneous-layers-config-encoded-json",
                       "qk-clip",
                       "qk-clip-alpha",
                       "qk-clip-threshold",
                       "use-mup"},
                      {"mhc-", "mup-", "no-yarn-"}));
  // Megatron's RotaryEmbedding divides the positions by the factor (Qwen3's example lines pass 1).
  r.push_back(no_effect_for(
      {"rotary-seq-len-interpolation-factor"}, {"1"}, "RoPE positions divided by 1: unchanged",
      unsupported("RoPE position interpolation (positions divided by the factor)", "drop the flag or pass 1")));
  r.push_back(
      no_effect("Megatron's default: YaRN's correction range rounded to whole channels, as moecore's MLA "
                "computes it",
                {"yarn-correction-range-round-to-int"}));
  r.push_back(no_effect("acts only with --use-rope-scaling (refused in moecore)", {"rope-scaling-factor"}));
  r.push_back(no_effect("acts only with --position-embedding-type relative (moecore has rope)",
                        {"relative-attention-num-buckets", "relative-attention-max-distance"}));
  r.push_back(no_effect("Megatron Core builds position embeddings from --position-embedding-type alone",
                        {"use-rotary-position-embeddings"}));
  r.push_back(no_effect("a kernel choice for Muon's Gram products (Triton SYRK): the same math", {"muon-use-syrk"}));
  r.push_back(no_effect_for({"softmax-type"}, {"vanilla"}, "the plain attention softmax, as moecore computes",
                            "off-by-one and learnable softmax are not supported by moecore"));
  r.push_back(refused(unsupported("hybrid Mamba, linear-attention and sparse-attention models"),
                      {"is-hybrid-model", "experimental-attention-variant", "disable-mamba-mem-eff-path",
                       "disable-dsa-indexer-rotate-activation", "disable-dsa-indexer-scoring-relu",
                       "no-dsa-indexer-rotate-activation", "no-dsa-indexer-scoring-relu"},
                      {"mamba-", "hybrid-", "linear-", "dsa-", "gdp-"}));
  r.push_back(refused(unsupported("this MoE option"),
                      {"moe-apply-probs-on-input", "moe-latent-size", "moe-expert-rank-capacity-factor",
                       "moe-router-force-biased", "moe-enable-routing-replay", "moe-extended-tp",
                       "moe-mlp-glu-interleave-size", "moe-shared-expert-glu-interleave-size"}));
  r.push_back(no_effect("acts only with --moe-router-load-balancing-type quantile_balancing (refused in moecore)",
                        {"moe-router-quantile-balancing-ema"}));
}

void not_gpt_pretraining(std::vector<FlagRule>& r) {
  r.push_back(refused(not_gpt("vision"),
                      {"img-h", "img-w", "patch-dim", "num-channels", "num-classes", "classes-fraction",
                       "data-per-class-fraction", "iter-per-epoch", "mask-factor", "mask-type", "mask-prob"},
                      {"dino-", "swin-", "vision-"}));
  r.push_back(refused(not_gpt("BERT, T5 and the biencoder/retriever"),
                      {"bert-load", "bert-no-binary-head", "bert-embedder-type", "output-bert-embeddings",
                       "block-data-path", "embedding-path", "evidence-data-path", "titles-data-path",
                       "query-in-block-prob", "use-one-sent-docs", "short-seq-prob", "vocab-extra-ids",
                       "encoder-num-layers", "decoder-num-layers", "encoder-seq-length", "decoder-seq-length"},
                      {"ict-", "biencoder-", "retriever-", "indexer-"}));
  r.push_back(refused(not_gpt("RETRO"), {}, {"retro-"}));
  r.push_back(refused(not_gpt("reinforcement learning"), {"perform-rl-step", "refit-method"},
                      {"rl-", "grpo-", "langrl-", "no-rl-", "no-langrl-"}));
  r.push_back(refused(
      not_gpt("inference serving"),
      {"flash-decode", "enable-chunked-prefill", "disable-chunked-prefill", "num-speculative-tokens",
       "use-legacy-static-engine", "decode-only-cuda-graphs", "mlp-chunks-for-prefill", "nccl-all-reduce-for-prefill",
       "max-tokens-to-oom", "moe-pad-experts-for-cuda-graph-inference", "use-same-sampling-seed-across-dp-ranks"},
      {"inference-", "no-inference-"}));
  r.push_back(refused(not_gpt("supervised fine-tuning (SFT)"), {"sft", "sft-tokenizer-prompt-format"}));
  r.push_back(refused(not_gpt("knowledge distillation"), {}, {"logits-"}));
}

}  // namespace

std::vector<FlagRule> megatron_flag_rules_more() {
  std::vector<FlagRule> r;
  numerics(r);
  selectors(r);
  communication(r);
  data_and_tokenizers(r);
  logging_and_resilience(r);
  model_features(r);
  not_gpt_pretraining(r);
  return r;
}

}  // namespace moecore::train
