// Where checkpoints live and how a save becomes visible: Megatron's layout (<root>/iter_0000100/ plus
// <root>/latest_checkpointed_iteration.txt naming the newest complete one, "release" for converted models), made
// atomic. All ranks write their shards into <root>/iter_0000100.tmp/, every file fsynced; after a barrier rank 0
// merges the index (refusing any gap or overlap), writes train_state.json, renames the directory into place and
// only then replaces the marker. A crash at any point leaves the previous checkpoint and marker untouched; the
// next save removes the stale temporary directory. Not the content: the trainer decides what is stored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/comm/process_group.h"

namespace moecore::ckpt {

inline constexpr const char* kLatestFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kStateFile = "train_state.json";

// <root>/iter_0000100, or <root>/release for iteration < 0.
std::string iteration_dir(const std::string& root, int64_t iteration);

// Testing crash safety: this rank kills itself (SIGKILL) after writing its shards of this iteration's checkpoint,
// before the save is committed. From the --fault-kill-during-save flag.
struct SaveFault {
  int64_t rank = -1, iteration = -1;
};

// Collective over `world` (null: one process). `mine`: this rank's tensors; `state`: train_state.json's content
// (rank 0's is written); `extra_files`: name -> content, copied into the directory by rank 0 (e.g. the tokenizer).
// Returns the directory written.
std::string save_checkpoint(const std::string& root, int64_t iteration, const std::vector<StoredTensor>& mine,
                            const nlohmann::json& state, const comm::ProcessGroup* world,
                            const std::vector<std::pair<std::string, std::string>>& extra_files = {},
                            SaveFault fault = {});

struct FoundCheckpoint {
  std::string dir;
  nlohmann::json state;  // train_state.json
};
// The checkpoint --load names: a root with a latest marker (its newest complete iteration) or an iteration
// directory itself. Empty when `path` holds no checkpoint at all (no marker, no index); throws, naming the file,
// when the marker or the state is broken or names a directory that is not there.
std::optional<FoundCheckpoint> find_checkpoint(const std::string& path);

}  // namespace moecore::ckpt
