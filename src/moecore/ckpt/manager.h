// Where checkpoints live and how a save becomes visible: Megatron's layout (<root>/iter_0000100/ plus
// <root>/latest_checkpointed_iteration.txt naming the newest complete one, "release" for converted models), made
// atomic. All ranks write their shards into <root>/iter_0000100.tmp/, every file fsynced; after a barrier rank 0
// merges the index (refusing any gap or overlap), writes train_state.json, renames the directory into place and
// only then replaces the marker. A crash at any point leaves the previous checkpoint and marker untouched; the
// next save removes the stale temporary directory. Megatron's marker stays a plain integer (or "release") that its
// tools read; its checksum and format version live in the sidecar latest_checkpointed_iteration.json, written just
// before it (metadata.h). Loading refuses what cannot be trusted (a .tmp or incomplete directory, a marker that
// disagrees with its sidecar, iteration directories without a marker) by name, and a save refuses to replace
// complete checkpoints the run did not load; a save killed before its commit (the marker's update) is set aside.
// Not the content: the trainer decides what is stored.
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
inline constexpr const char* kMarkerSidecar = "latest_checkpointed_iteration.json";

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
                            SaveFault fault = {}, bool integrity = false);

// The same in phases, for asynchronous saves: begin_save (collective: rank 0 creates the temporary directory),
// write_rank_files (this rank's shards and index fragment, fsynced; no communication, so any thread may run it),
// then commit_save (collective: rank 0 merges the index, writes the state and extra files, renames the directory
// into place and only then moves the marker) or, after a failed write, abandon_save.
struct PendingSave {
  std::string root, tmp, final_dir;
  int64_t iteration = 0;
  bool integrity = false;  // --verify-integrity: commit_save writes the integrity manifest last
};
PendingSave begin_save(const std::string& root, int64_t iteration, const comm::ProcessGroup* world);
void write_rank_files(const PendingSave& p, int64_t rank, const std::vector<StoredTensor>& mine, SaveFault fault);
// `fragments`: how many index fragments (write_rank_files calls) to merge; 0: one per rank of `world`.
void commit_save(const PendingSave& p, const nlohmann::json& state, const comm::ProcessGroup* world,
                 const std::vector<std::pair<std::string, std::string>>& extra_files, int64_t fragments = 0);
void abandon_save(const PendingSave& p, int64_t rank);

// Megatron's --verify-integrity: integrity.json lists every other file of a checkpoint directory (relative path)
// with a hash of its bytes (XXH3-64 here, SHA-256 in Megatron), written by rank 0 as the save's last file. Verifying
// re-hashes each listed file and throws naming the missing or changed ones, or the manifest itself when the
// checkpoint was saved without it.
inline constexpr const char* kIntegrityFile = "integrity.json";
void write_integrity_manifest(const std::string& dir);
void verify_integrity_manifest(const std::string& dir);

// Deletes the checkpoints iter_N of `root` for N in `iterations` (one rank calls it): each directory is renamed
// to iter_N.deleted first, so a crash mid-deletion leaves nothing that looks like a checkpoint. Symbolic links
// are skipped (as in Megatron). The caller decides what may go (--save-retain-interval, --keep-last-checkpoints).
void delete_checkpoints(const std::string& root, const std::vector<int64_t>& iterations);

struct FoundCheckpoint {
  std::string dir;
  nlohmann::json state;  // train_state.json, validated (metadata.h)
  bool legacy = false;   // written before checksummed metadata: fields validated, no checksum to verify
  std::string note;      // for the user, when non-empty (e.g. a marker update interrupted by a crash)
};
// The checkpoint --load names: a root with a latest marker (its newest complete iteration) or an iteration
// directory itself; with `step` >= 0 (--ckpt-step) the root's iteration `step`, whatever the marker says. Empty
// when `path` holds no checkpoint at all (no marker, no index, no complete iteration directory). Throws, naming the
// file, when the marker, its sidecar, the state or the index is broken or names a directory that is not there; when
// `path` is a .tmp or incomplete directory; when complete iteration directories are there but no marker; when it
// holds a Megatron checkpoint (foreign_checkpoint.h).
std::optional<FoundCheckpoint> find_checkpoint(const std::string& path, int64_t step = -1);

// The complete checkpoints (index.json and train_state.json present) iter_NNNNNNN of `root`, by iteration.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root);

// Before the first step of a run saving to `root`: refuses when `root` holds complete checkpoints that a save would
// overwrite although the run did not load them, i.e. at or after `start_iteration` (the iteration training
// continues from; -1: nothing loaded, a fresh run), except `loaded_dir` itself when training resumes from it.
void check_save_overwrites(const std::string& root, int64_t start_iteration, const std::string& loaded_dir);
// The commit point of a save is the marker's update: a save renames its finished directory into place and only
// then moves the marker. A kill between the two leaves an uncommitted save: a complete iteration directory newer
// than the marker that the marker never named. The marker moecore writes only moves forward over the complete
// checkpoints of its root (check_save_overwrites refuses a save behind one), so when the marker is the one moecore
// wrote last (its sidecar records the same text), every complete directory newer than it is uncommitted. A
// marker moved back by hand disagrees with its sidecar and is refused by find_checkpoint; a root without a sidecar
// (an older format, or no save ever committed) says nothing of what was committed. Either way its newer
// directories stay protected by check_save_overwrites.
//
// The uncommitted saves of `root` (by iteration) when the run trains on from the checkpoint its marker names
// (`loaded_dir`, at `start_iteration`, as for check_save_overwrites); empty otherwise.
std::vector<std::pair<int64_t, std::string>> uncommitted_saves(const std::string& root, int64_t start_iteration,
                                                               const std::string& loaded_dir);
// Collective over `world` (null: one process), before any write of the run: every rank finds the uncommitted
// saves, the ranks check that they see the same ones, and rank 0 renames each iter_N to
// iter_N.uncommitted-<k> (k the first number free; never replacing anything, never deleting). Returns one line per
// directory set aside, saying what and why.
std::vector<std::string> set_aside_uncommitted_saves(const std::string& root, int64_t start_iteration,
                                                     const std::string& loaded_dir, const comm::ProcessGroup* world);

// Before the first step: `root` is created, a probe file written and removed (this rank's), and its file system
// has `bytes` free (statvfs) for one checkpoint; otherwise throws naming the directory, the bytes needed and free.
void check_save_directory(const std::string& root, int64_t bytes, int64_t rank);

}  // namespace moecore::ckpt
