// Regression cases of the fuzzers (tests/fuzz/): each input is a user error naming the file, never another
// exception type and never undefined behaviour (a float id or shape beyond int64's range was cast by nlohmann's
// get<int64_t>(): UBSan aborts sanitized_unit_tests on it). Checkpoint metadata: ckpt/test_metadata_fuzz_regressions.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/core/error.h"
#include "moecore/data/tokenizer.h"
#include "moecore/train/config/config.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

TEST(ParserFuzzRegressions, YamlMapInsideAListIsAUserError) {
  const std::string path = testing::fresh_temp_path("fuzz_regression.yaml");
  std::ofstream(path) << "num-layers: 2\ndata-path: [0.7,: /tmp/a, 0.3]\n";
  EXPECT_NE(testing::user_error_of([&] { train::parse_flags({"--config", path}); }).find(path), std::string::npos);
  std::ofstream(path) << "? [a, b]\n: 1\n";  // a key that is a list
  EXPECT_NE(testing::user_error_of([&] { train::parse_flags({"--config", path}); }).find(path), std::string::npos);
  fs::remove(path);
}

TEST(ParserFuzzRegressions, TokenizerIdsMustBeIntegers) {
  for (const std::string id : {"1e300", "0.5"}) {
    const std::string j = R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "merges": [],
        "vocab": {"a": )" +
                          id + "}}}";
    EXPECT_NE(testing::user_error_of([&] { data::Tokenizer::from_json(j, "t"); }).find("not an integer"),
              std::string::npos)
        << id;
  }
}

TEST(ParserFuzzRegressions, CheckpointShapesMustBeIntegers) {
  const fs::path dir = testing::fresh_temp_path("fuzz_regression_index");
  fs::create_directories(dir);
  std::ofstream(dir / "index.json") << R"({"format": "moecore-native-1", "shards": [{"name": "w", "file": "f",
      "global": [9.3e19, 2], "offset": [0, 0], "size": [1, 2], "dtype": "F32", "xxh3_64": "0000000000000000"}]})";
  EXPECT_NE(testing::user_error_of([&] { ckpt::read_model_index(dir.string()); }).find("not an integer"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moecore
