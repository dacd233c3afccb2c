// The relations between flags that validate() checks (config.h), one concern per file: the model's shape, the
// parallel layout and device, MoE, the optimizer, precision and schedule, data and logging, checkpoints and run
// control. Each throws Error naming the flags, the values and the fix. validate() checks every flag against its table
// row (Accepts) first, so these see accepted values and do not repeat those ranges.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "moecore/train/config/config.h"

namespace moecore::train {

// Whether a list flag's values (--offload-modules, --recompute-modules, --cuda-graph-modules, ...) hold `value`.
inline bool holds(const std::vector<std::string>& values, const std::string& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// Attention and positions, MLA and its YaRN, MTP, the vocabulary padding, and activation recompute
// (config_validate_model.cpp).
void validate_model(const TrainConfig& c);
// Fine-grained activation offloading: Megatron's rules for --offload-modules (config_validate_offload.cpp).
void validate_offload(const TrainConfig& c);
// FP8: Megatron's rules for --fp8-format, --fp8-recipe and the layers kept in bf16 (config_fp8.cpp).
void validate_fp8(const TrainConfig& c);
// The no-effect line for FP8 recipe flags given without --fp8-format, or "".
std::string fp8_no_effect(const TrainConfig& c);
// The training device, context and pipeline parallelism, tensor and sequence parallelism, the expert mesh
// (config_validate_parallel.cpp).
void validate_parallel(const TrainConfig& c);
// The router's coefficients, the experts and their dispatcher, the shared expert's overlap, the upcycled experts'
// sizes (config_validate_moe.cpp).
void validate_moe(const TrainConfig& c);
// Megatron's rules for the communication overlaps (--overlap-grad-reduce, --overlap-param-gather, the MoE
// expert-parallel overlap and --delay-wgrad-compute) (config_validate_overlap.cpp).
void validate_overlap(const TrainConfig& c);
// Megatron FSDP: Megatron's rules for --use-megatron-fsdp and its sharding and dtype flags, moecore's refusals
// (config_validate_fsdp.cpp).
void validate_fsdp(const TrainConfig& c);
// Megatron's rules for its CUDA-graph flags (no effect in moecore, their validation kept): the deprecated switches
// and names, the modules against the model, recompute, dropout, offloading, the overlaps
// (config_validate_cuda_graph.cpp).
void validate_cuda_graph(const TrainConfig& c);
// The no-effect line for the FSDP flags given where Megatron does not read them, or "".
std::string fsdp_no_effect(const TrainConfig& c);
// The batch, Adam's state dtypes, Muon, sample- or iteration-based training and the learning-rate schedule
// (config_validate_optimizer.cpp).
void validate_optimizer(const TrainConfig& c);
// Data and tokenizer, the EOD mask, the health alarms (config_validate_data.cpp).
void validate_data(const TrainConfig& c);
// --load and what applies to it, upcycling's inputs, retained saves, the stop signal and the testing faults
// (config_validate_checkpointing.cpp).
void validate_checkpointing(const TrainConfig& c);

}  // namespace moecore::train
