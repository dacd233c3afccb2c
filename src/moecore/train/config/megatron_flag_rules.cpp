// The rules for Megatron-LM's flags that moecore's flag table does not hold (see megatron_flags.h), each
// classified by reading what Megatron does with it. A flag named here must not be in the table and must be in
// tests/train/megatron_flags.txt (tests/train/test_megatron_flags.cpp checks both, and that every flag has a rule).
#include "moecore/ckpt/foreign_checkpoint.h"
#include "moecore/train/config/megatron_flag_rule_builders.h"

namespace moecore::train {
namespace {

using namespace rule_builders;  // NOLINT(build/namespaces): the rule tables read as prose

std::vector<FlagRule> build_rules() {
  std::vector<FlagRule> r;
  r.push_back(
      refused(unsupported("batch-size rampup", "train with a constant --global-batch-size"), {"rampup-batch-size"}));

  // --- Features another issue will implement: refused with the feature named --------------------------------------
  // Pipeline transport details: moecore's sends and receives are always non-blocking and posted one pass ahead
  // over MPI, so these change timing in Megatron, never the math.
  r.push_back(no_effect(
      "a pipeline transport detail (moecore overlaps its non-blocking MPI sends and receives)",
      {"no-overlap-p2p-communication", "overlap-p2p-communication-warmup-flush",
       "no-scatter-gather-tensors-in-pipeline", "pipeline-model-parallel-comm-backend", "use-ring-exchange-p2p"}));
  r.push_back(refused(unsupported("hybrid context parallelism (dynamic CP per sequence)",
                                  "use a fixed --context-parallel-size with --cp-comm-type"),
                      {"hybrid-context-parallel", "max-seqlen-per-dp-cp-rank"}));
  r.push_back(
      refused("--checkpoint-activations is no longer valid in Megatron; use --recompute-activations, or "
              "--recompute-granularity and --recompute-method",
              {"checkpoint-activations"}));
  r.push_back(refused(unsupported("--distribute-saved-activations (full recompute's saved layer inputs split over the "
                                  "tensor-parallel group; it changes memory, not the math)",
                                  "drop it: full recompute keeps each chunk's whole input"),
                      {"distribute-saved-activations"}));
  r.push_back(no_effect(
      "acts only while a CUDA graph replays (Megatron defers the offloads into the replay); moecore captures no CUDA "
      "graphs, so the copies start as they do without it",
      {"delay-offload-until-cuda-graph"}));
  r.push_back(refused(unsupported("CPU offloading of activations or weights"),
                      {"activation-offload-fraction", "delta-offload-bytes-across-pp-ranks"}, {"cpu-offloading"}));
  r.push_back(
      refused("MLA latent caching serves Megatron's dynamic inference engine; moecore trains and has no such engine",
              {"cache-mla-latents"}));
  r.push_back(refused(unsupported("the fused MLA down projection (one linear_qkv_down_proj weight)",
                                  "leave it off: the unfused MLA computes the same"),
                      {"mla-down-proj-fusion"}));
  r.push_back(refused(
      unsupported("this multi-token prediction variant", "use --mtp-num-layers alone (separate, trained depths)"),
      {"mtp-detach-heads", "mtp-hsm", "mtp-hybrid-override-pattern", "mtp-standalone", "mtp-use-repeated-layer"}));
  r.push_back(
      refused(unsupported("this FP8 option", "use --fp8-format with --fp8-recipe delayed, tensorwise or blockwise"),
              {"disable-fp8-wgrad", "no-fp8-wgrad", "keep-fp8-transpose-cache", "reuse-grad-buf-for-mxfp8-param-ag",
               "moe-router-padding-for-fp8", "moe-router-padding-for-quantization", "te-precision-config-file",
               "use-kitchen-attention", "fp8-output-proj", "fp8-quantizer-factory"},
              {"kitchen-"}));
  r.push_back(no_effect("deprecated in Megatron, which ignores it (delayed scaling updates after every cast)",
                        {"fp8-interval"}));
  r.push_back(refused("FP4 training (NVFP4) is Blackwell-only; this build targets Hopper and CPUs: use --fp8-format",
                      {}, {"fp4-"}));
  // Megatron's cross-entropy computed in fp16 on the output layer's fp16 logits; without the flag (its default, and
  // moecore's only way) the loss is computed on the logits upcast to fp32.
  r.push_back(refused(unsupported("the cross-entropy computed in fp16",
                                  "drop it: the loss is computed on the logits upcast to fp32, as Megatron's default"),
                      {"fp16-lm-cross-entropy"}));
  // Megatron FSDP is in the flag table (--use-megatron-fsdp and its sharding, dtype and buffer flags); torch's FSDP2
  // is not, and the rest tune how Megatron FSDP schedules its GPU collectives and buffers.
  r.push_back(refused(unsupported("torch FSDP2 (--use-torch-fsdp2)",
                                  "use --use-megatron-fsdp (the same sharding, Megatron's own implementation)"),
                      {"use-torch-fsdp2"}));
  r.push_back(no_effect("acts only with --use-torch-fsdp2 (refused in moecore)",
                        {"torch-fsdp2-no-reshard-after-forward", "no-pin-cpu-grads", "no-pin-cpu-params"}));
  r.push_back(no_effect_for({"megatron-fsdp-version"}, {"1"},
                            "Megatron FSDP's first implementation, the one moecore's --use-megatron-fsdp follows",
                            unsupported("Megatron FSDP version 2", "use --megatron-fsdp-version 1 (the default)")));
  r.push_back(no_effect(
      "how Megatron FSDP splits and registers its GPU collectives and buffers (moecore gathers and reduces each unit "
      "whole, one collective per unit and storage dtype, with the same numbers)",
      {"megatron-fsdp-enable-fine-grained-param-gather", "suggested-communication-unit-size",
       "fsdp-manual-registration", "fsdp-db-use-persist-buf-on-alloc-fail"}));
  r.push_back(refused(unsupported("Megatron FSDP's max-pool double buffer (buffers for every unit size)",
                                  "use --fsdp-double-buffer: two buffers of the largest unit's size"),
                      {"megatron-fsdp-max-pool-double-buffer"}));
  r.push_back(no_effect("Megatron reads it nowhere (the outer group's sharding is --outer-dp-sharding-strategy)",
                        {"enable-full-sharding-in-hsdp"}));
  r.push_back(no_effect(
      "non-strict loading of Megatron's fsdp_dtensor checkpoints (moecore checks every load strictly: a missing or "
      "unexpected tensor is an error)",
      {"disable-strict-fsdp-dtensor-load", "no-strict-fsdp-dtensor-load"}));

  // --- Checkpoints ---------------------------------------------------------------------------------------------------
  // Format selectors (--ckpt-format is in the table): moecore writes its own format whatever they say. Converting
  // on load into another format is a different run, refused.
  r.push_back(no_effect(std::string("deprecated in Megatron, which ignores it (--ckpt-format selects the format); ") +
                            ckpt::kOwnCheckpointFormat,
                        {"use-dist-ckpt", "dist-ckpt-format"}));
  r.push_back(no_effect(ckpt::kOwnCheckpointFormat, {"auto-detect-ckpt-format"}));
  r.push_back(refused(std::string("converting a checkpoint into another format on load is not supported by moecore, "
                                  "which reads and writes only its own format (--ckpt-format moecore, the default). ") +
                          ckpt::kMegatronCheckpointWayIn,
                      {"ckpt-convert-format", "ckpt-convert-save", "ckpt-convert-update-legacy-dist-opt-format"}));
  r.push_back(
      no_effect("how ranks share the work of saving and loading a checkpoint (moecore writes the same "
                "files either way)",
                {"ckpt-fully-parallel-save", "no-ckpt-fully-parallel-save", "ckpt-fully-parallel-load",
                 "ckpt-fully-parallel-save-process-group", "ckpt-fully-parallel-load-process-group",
                 "ckpt-fully-parallel-load-exchange-algo", "ckpt-fully-parallel-load-per-rank-objects",
                 "ckpt-assume-constant-structure", "ckpt-pg-tensors-cache-create", "ckpt-pg-tensors-cache-path",
                 "dist-ckpt-workers", "async-ckpt-cpu-priority", "async-ckpt-io-priority", "async-ckpt-use-cpu-shm",
                 "async-strategy", "use-persistent-ckpt-worker"}));
  r.push_back(
      no_effect("options of Megatron's distributed-checkpoint format (moecore checkpoints load under any "
                "layout and every load is checked strictly: a missing or unexpected tensor is an error)",
                {"dist-ckpt-strictness", "dist-ckpt-optim-fully-reshardable", "dist-ckpt-save-pre-mcore-014",
                 "distrib-optim-fully-reshardable-mem-efficient", "ckpt-drop-redundant-extra-state",
                 "disable-ckpt-load-validate-sharding-integrity", "no-ckpt-load-validate-sharding-integrity",
                 "no-use-layer-wise-param-layout"}));
  r.push_back(refused(unsupported("saving checkpoints without the optimizer or RNG state",
                                  "moecore checkpoints always hold them; --no-load-optim and --no-load-rng skip them "
                                  "on load"),
                      {"no-save-optim", "no-save-rng"}));
  r.push_back(refused(unsupported("leaving the tokenizer out of checkpoints", "moecore checkpoints always hold it"),
                      {"disable-save-tokenizer-assets", "no-save-tokenizer-assets"}));
  r.push_back(refused(
      unsupported("non-persistent (local or in-memory) checkpointing", "use --save and --save-interval"),
      {"persistent-save-interval", "replication", "replication-factor", "replication-jump"}, {"non-persistent-"}));
  r.push_back(
      refused(unsupported("this checkpoint option", "use --load with --finetune, --no-load-optim, --no-load-rng"),
              {"pretrained-checkpoint", "load-main-params-from-ckpt", "override-ckpt-iteration",
               "use-mp-args-from-checkpoint-args", "exit-on-missing-checkpoint", "no-initialization"}));
  r.push_back(
      no_effect("moecore's --use-checkpoint-args never takes --tokenizer-model from the checkpoint",
                {"disable-use-tokenizer-model-from-checkpoint-args", "no-use-tokenizer-model-from-checkpoint-args"}));
  return r;
}

}  // namespace

std::vector<FlagRule> megatron_flag_rules_more();  // megatron_flag_rules_more.cpp

const std::vector<FlagRule>& megatron_flag_rules() {
  static const std::vector<FlagRule> rules = [] {
    std::vector<FlagRule> r = build_rules();
    for (auto& x : megatron_flag_rules_more()) r.push_back(std::move(x));
    return r;
  }();
  return rules;
}

}  // namespace moecore::train
