// Regression cases of the checkpoint metadata fuzzer (tests/fuzz/fuzz_checkpoint_metadata.cpp): a "format" of
// the wrong JSON type in train_state.json or index.json is a user error naming the file, not an escaped
// nlohmann::json::type_error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

TEST(CheckpointMetadata, FormatOfWrongTypeIsAUserError) {
  const fs::path root = testing::fresh_temp_path("ckpt_meta_format");
  fs::create_directories(root / "iter_0000001");
  write_text(root / ckpt::kLatestFile, "1\n");
  write_text(root / "iter_0000001" / "index.json", R"({"format": 5, "shards": []})");
  write_text(root / "iter_0000001" / ckpt::kStateFile, R"({"format": 5, "iteration": "x"})");
  EXPECT_NE(testing::user_error_of([&] { ckpt::find_checkpoint(root.string()); }).find("train_state.json"),
            std::string::npos);
  EXPECT_NE(
      testing::user_error_of([&] { ckpt::read_model_index((root / "iter_0000001").string()); }).find("index.json"),
      std::string::npos);
  // With the format right, the checks go on to the fields: the refusals above were about the format's type.
  write_text(root / "iter_0000001" / "index.json", R"({"format": "moecore-native-1", "shards": []})");
  write_text(root / "iter_0000001" / ckpt::kStateFile, R"({"format": "moecore-train-state-1"})");
  EXPECT_NE(testing::user_error_of([&] { ckpt::find_checkpoint(root.string()); }).find("field 'iteration' is missing"),
            std::string::npos);
  EXPECT_TRUE(ckpt::read_model_index((root / "iter_0000001").string()).empty());
  fs::remove_all(root);
}

}  // namespace
}  // namespace moecore
