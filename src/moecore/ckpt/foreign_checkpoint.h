// Recognising another trainer's checkpoint where moecore expects its own: Megatron-LM's torch_dist, zarr, torch_dcp
// and fsdp_dtensor formats (an iteration directory of torch.distributed.checkpoint files) and its legacy torch
// format (mp_rank_XX/model_optim_rng.pt), so --load refuses one by name with the way to bring it in. Not a reader:
// moecore loads only its own checkpoints (manager.h).
#pragma once

#include <optional>
#include <string>

namespace moecore::ckpt {

// What moecore does with Megatron's checkpoint format selectors (--ckpt-format torch_dist, ...), and how to bring a
// Megatron checkpoint into moecore: as the refusals, the flag rules and --ckpt-format's no-effect line say it.
inline constexpr const char* kOwnCheckpointFormat =
    "moecore saves and loads its own checkpoint format whatever the selector says (Megatron's iter_NNNNNNN "
    "directories and latest marker, moecore's files inside), and --load refuses a Megatron checkpoint naming its "
    "format";
inline constexpr const char* kMegatronCheckpointWayIn =
    "To bring a Megatron checkpoint over, export it to HuggingFace from Megatron, then run `moecore convert "
    "hf-to-native --input HF_DIR --output DIR` and train with --load DIR";

// What `path` (a checkpoint root or one iteration directory) holds when it is a Megatron checkpoint, naming the
// files that say so: "a Megatron-LM torch_dist checkpoint (iter_0000100/ with metadata.json, .metadata, common.pt,
// 2 .distcp files)". Empty when it is not one: a moecore checkpoint, an unrelated or missing directory.
std::optional<std::string> describe_foreign_checkpoint(const std::string& path);

// Throws Error for --load `path` when describe_foreign_checkpoint recognises it, with what it found and what to do.
void refuse_foreign_checkpoint(const std::string& path);

}  // namespace moecore::ckpt
