// I/O errors are errors: a full disk while writing a checkpoint, the metrics file, preprocess
// output, a tokenizer or an HF export ends the job with a message naming the file and the OS error, and leaves
// the last good files as they were. The full disk is provoked without privileges: /dev/full (ENOSPC) for streams,
// and a file-size limit (RLIMIT_FSIZE with SIGXFSZ ignored: writes fail with EFBIG) for files in a directory.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "ckpt_fixture.h"
#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/data/bpe_trainer.h"
#include "moecore/data/preprocess.h"
#include "moecore/train/observe/metrics.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::digest;
using testing::error_of;

// While alive, no file of this process may grow past `bytes`: the write that would fails with EFBIG.
struct FileSizeLimit {
  rlimit saved{};
  void (*old_handler)(int);
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved);
    old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit r = saved;
    r.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &r), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
  }
};

TEST(CheckpointIO, FullDiskDuringSaveKeepsThePreviousCheckpoint) {
  const std::string root = testing::own_temp_path("io_save");
  testing::NullOut null;
  train::Trainer t(testing::ckpt_config({"--save", root}), null.f, false);
  t.train_step();
  t.train_step();
  t.save_checkpoint();
  const auto before = digest(root);
  t.train_step();
  t.train_step();
  std::string e;
  {
    const FileSizeLimit limit(16 * 1024);  // the shards are larger
    e = error_of([&] { t.save_checkpoint(); });
  }
  EXPECT_TRUE(contains(
      e, "cannot write " + ckpt::iteration_dir(root, 4) + ".tmp/model_rank00000.safetensors: " + std::strerror(EFBIG)))
      << e;
  EXPECT_EQ(digest(root), before);  // iteration 2, the marker and its sidecar as they were; no partial directory
  EXPECT_EQ(ckpt::find_checkpoint(root)->dir, ckpt::iteration_dir(root, 2));
  // Room again: the same run saves.
  t.save_checkpoint();
  EXPECT_EQ(ckpt::find_checkpoint(root)->dir, ckpt::iteration_dir(root, 4));
  fs::remove_all(root);
}

TEST(CheckpointIO, MetricsFileAndLogOnAFullDevice) {
  const train::TrainConfig c = testing::ckpt_config({});
  train::MetricsLog log(c, nullptr, "/dev/full", false);
  const std::string e = error_of([&] { log.write_json({{"iteration", 1}}); });
  EXPECT_TRUE(contains(e, std::string("cannot write /dev/full: ") + std::strerror(ENOSPC))) << e;
  std::FILE* full = std::fopen("/dev/full", "w");
  ASSERT_NE(full, nullptr);
  std::fputs("a log line\n", full);
  const std::string e2 = error_of([&] { flush_checked(full, "training log"); });
  std::fclose(full);
  EXPECT_TRUE(contains(e2, std::string("cannot write the training log: ") + std::strerror(ENOSPC))) << e2;
}

TEST(CheckpointIO, AtomicReplaceKeepsTheOldFileOnAFullDisk) {
  const std::string d = testing::own_temp_path("io_atomic");
  fs::create_directories(d);
  write_file_atomic(d + "/f.json", "old");
  std::string e;
  {
    const FileSizeLimit limit(4096);
    e = error_of([&] { write_file_atomic(d + "/f.json", std::string(8192, 'x')); });
  }
  EXPECT_TRUE(contains(e, "cannot write " + d + "/f.json.tmp: " + std::strerror(EFBIG))) << e;
  EXPECT_EQ(read_file(d + "/f.json", "test"), "old");
  EXPECT_FALSE(fs::exists(d + "/f.json.tmp"));
  fs::remove_all(d);
}

TEST(PreprocessIO, FullDiskKeepsThePreviousOutput) {
  const std::string d = testing::own_temp_path("io_preprocess");
  fs::create_directories(d + "/tok");
  std::string corpus, jsonl;
  for (int i = 0; i < 400; i++) {
    const std::string line = "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog";
    corpus += line + "\n";
    jsonl += nlohmann::json({{"text", line}}).dump() + "\n";
  }
  write_file_atomic(d + "/tok/tokenizer.json", data::train_bpe_tokenizer_json(corpus, 300, {"<|endoftext|>"}));
  write_file_atomic(d + "/in.jsonl", jsonl);
  data::PreprocessOptions o;
  o.input = d + "/in.jsonl";
  o.output_prefix = d + "/out";
  o.tokenizer_model = d + "/tok";
  data::preprocess(o);
  const auto before = digest(d);
  write_file_atomic(d + "/in.jsonl", jsonl + jsonl + jsonl + jsonl);  // a larger second run
  const auto input_changed = digest(d);
  std::string e;
  {
    const FileSizeLimit limit(8192);
    e = error_of([&] { data::preprocess(o); });
  }
  EXPECT_TRUE(contains(e, "cannot write " + d + "/out_text_document.bin.tmp: " + std::strerror(EFBIG))) << e;
  EXPECT_EQ(digest(d), input_changed);  // the first run's .bin/.idx as they were, no temporary left
  EXPECT_EQ(before.at("out_text_document.bin"), input_changed.at("out_text_document.bin"));
  fs::remove_all(d);
}

TEST(HFExportIO, FullDiskKeepsAnEarlierExport) {
  const std::string root = testing::own_temp_path("io_hf");
  testing::make_checkpoints(root, {1});
  const std::string out = testing::own_temp_path("io_hf_out");
  ckpt::convert_native_to_hf(root, out, "mixtral", "f32", int64_t{1} << 30);
  const auto before = digest(out);
  std::string e;
  {
    const FileSizeLimit limit(16 * 1024);
    e = error_of([&] { ckpt::convert_native_to_hf(root, out, "mixtral", "f32", int64_t{1} << 30); });
  }
  EXPECT_TRUE(contains(e, "cannot write " + out + "/part-00000.tmp: " + std::strerror(EFBIG))) << e;
  EXPECT_EQ(digest(out), before);
  fs::remove_all(root);
  fs::remove_all(out);
}

}  // namespace
}  // namespace moecore
