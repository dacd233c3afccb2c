// Checkpoint metadata you can trust: every JSON metadata file (train_state.json with the saved configuration,
// index.json, the marker's sidecar latest_checkpointed_iteration.json) carries a format version and an XXH3-64
// checksum of its content, and is validated field by field on load (types, ranges, consistency with the index),
// with messages naming the file and the field. Not the tensors: their checksums are in index.json (checkpoint.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moecore/ckpt/checkpoint.h"

namespace moecore::ckpt {

// Formats written now; the previous ones (no checksum) are still read, their fields validated.
inline constexpr const char* kTrainStateFormat = "moecore-train-state-2";
inline constexpr const char* kTrainStateFormatV1 = "moecore-train-state-1";
inline constexpr const char* kIndexFormat = "moecore-native-2";
inline constexpr const char* kIndexFormatV1 = "moecore-native-1";
inline constexpr const char* kMarkerFormat = "moecore-marker-1";
// What a damaged or edited metadata file's message ends with.
inline constexpr const char* kMetadataFix =
    "the file was edited or damaged after it was written: restore the checkpoint from a copy, or load another "
    "iteration with --ckpt-step N";

// `j` (an object) with "checksum": the XXH3-64, in hex, of `j` without it dumped compactly (keys sorted).
nlohmann::json with_checksum(nlohmann::json j);
// The file content for `j`: with_checksum(j), indented, newline-terminated.
std::string metadata_text(const nlohmann::json& j);

// Reads the metadata file `path` (`what` names it in messages): valid JSON, an object, "format" one of `formats`.
// formats[0] is the current format, which must carry a matching checksum; older ones may lack it (`*legacy` set).
// Returns the object without "checksum".
nlohmann::json read_metadata(const std::string& path, const char* what, const std::vector<std::string>& formats,
                             bool* legacy = nullptr);

// Typed, range-checked access to a metadata object's fields; a failure names the file and the field.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string file, std::string prefix = "");
  bool has(const char* key) const;
  int64_t integer(const char* key, int64_t lo, int64_t hi = INT64_MAX) const;
  bool boolean(const char* key) const;
  // A finite number, or null (NaN saved by JSON as null).
  double number_or_null(const char* key) const;
  std::string string(const char* key) const;
  Fields object(const char* key) const;
  const nlohmann::json& json() const { return j_; }
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;

 private:
  const nlohmann::json& at(const char* key) const;
  const nlohmann::json& j_;
  std::string file_, prefix_;
};

// Validates a checkpoint's train_state.json (read from `dir`, an iteration directory or release/): every field's
// type and range, the iteration against the directory's name, consumed_samples against the iteration and the
// global batch size of the run that saved it.
void validate_train_state(const nlohmann::json& state, const std::string& dir);
// Cross-checks the state with the index: vocabulary rows, optimizer state present, shard files within the world.
void validate_state_against_index(const nlohmann::json& state, const std::vector<ShardRecord>& records,
                                  const std::string& dir);

}  // namespace moecore::ckpt
