// CRC-32C, the TFRecord framing and the event-file writer of --tensorboard-dir (the files read back by an
// independent Python reader: tests/train/tensorboard.sh), and the TensorBoard flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config_util.h"
#include "moecore/core/crc32c.h"
#include "moecore/train/observe/tensorboard/event.pb.h"
#include "moecore/train/observe/tensorboard_writer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

TEST(Crc32c, StandardCheckValueAndMasking) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  const std::string a = "hello ", b = "tensorboard";
  EXPECT_EQ(crc32c(b.data(), b.size(), crc32c(a)), crc32c(a + b));  // continues across calls
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

// The records of a TFRecord file, both CRCs checked.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string d = ss.str();
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < d.size()) {
    EXPECT_GE(d.size() - pos, 16u);
    const uint64_t n = le(d, pos, 8);
    EXPECT_EQ(le(d, pos + 8, 4), mask_crc32c(crc32c(d.data() + pos, 8)));
    std::string rec = d.substr(pos + 12, n);
    EXPECT_EQ(le(d, pos + 12 + n, 4), mask_crc32c(crc32c(rec)));
    out.push_back(std::move(rec));
    pos += 16 + n;
  }
  return out;
}

TEST(TensorBoard, TfRecordFraming) {
  const std::string f = train::tfrecord_frame("abc");
  ASSERT_EQ(f.size(), 3u + 16u);
  EXPECT_EQ(le(f, 0, 8), 3u);
  EXPECT_EQ(le(f, 8, 4), mask_crc32c(crc32c(f.data(), 8)));
  EXPECT_EQ(f.substr(12, 3), "abc");
  EXPECT_EQ(le(f, 15, 4), mask_crc32c(crc32c("abc")));
  EXPECT_EQ(train::tfrecord_frame("").size(), 16u);
}

TEST(TensorBoard, ExpertLoadHistogramIsOverExpertIndices) {
  const train::Histogram h = train::expert_load_histogram({3, 0, 5, 2});
  EXPECT_EQ(h.bucket, (std::vector<double>{3, 0, 5, 2}));
  EXPECT_EQ(h.bucket_limit, (std::vector<double>{0.5, 1.5, 2.5, 3.5}));
  EXPECT_EQ(h.num, 10);
  EXPECT_EQ(h.min, 0);
  EXPECT_EQ(h.max, 3);
  EXPECT_EQ(h.sum, 0 * 3 + 2 * 5 + 3 * 2);
  EXPECT_EQ(h.sum_squares, 4 * 5 + 9 * 2);
}

TEST(TensorBoard, WriterQueuesThenWritesReadableEvents) {
  const std::string dir = testing::fresh_temp_path("tensorboard_writer") + "/run/a";  // parents created
  std::string path;
  {
    train::EventFileWriter w(dir, 3);
    path = w.path();
    EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(dir));
    EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
    const auto header_size = std::filesystem::file_size(path);  // the file-version record, written at once
    EXPECT_GT(header_size, 16u);
    w.add_scalar("lm loss", 2.5, 1);
    w.add_scalar("lm loss vs samples", 2.5, 8);
    EXPECT_EQ(std::filesystem::file_size(path), header_size);  // queued
    w.add_histogram("moe/tokens_per_expert_layer_0", train::expert_load_histogram({1, 2}), 1);
    EXPECT_GT(std::filesystem::file_size(path), header_size);  // the third record sends the queue
    w.add_scalar("grad-norm", 0.125, 2);
  }  // closed: the last record flushed
  const auto recs = read_records(path);
  ASSERT_EQ(recs.size(), 5u);
  tensorboard::Event e;
  ASSERT_TRUE(e.ParseFromString(recs[0]));
  EXPECT_EQ(e.file_version(), "brain.Event:2");
  ASSERT_TRUE(e.ParseFromString(recs[2]));
  EXPECT_EQ(e.step(), 8);
  ASSERT_EQ(e.summary().value_size(), 1);
  EXPECT_EQ(e.summary().value(0).tag(), "lm loss vs samples");
  EXPECT_EQ(e.summary().value(0).simple_value(), 2.5f);
  ASSERT_TRUE(e.ParseFromString(recs[3]));
  EXPECT_EQ(e.summary().value(0).histo().num(), 3);
  EXPECT_EQ(e.summary().value(0).histo().bucket_size(), 2);
  ASSERT_TRUE(e.ParseFromString(recs[4]));
  EXPECT_EQ(e.step(), 2);
  EXPECT_EQ(e.summary().value(0).simple_value(), 0.125f);
  EXPECT_GT(e.wall_time(), 1.7e9);
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path().parent_path());
}

TEST(TensorBoard, UnusableDirectoryIsAnErrorNamingIt) {
  const std::string file = testing::fresh_temp_path("tensorboard_not_a_dir");
  std::ofstream(file) << "x";
  const std::string err = testing::user_error_of([&] { train::EventFileWriter w(file + "/tb", 10); });
  EXPECT_NE(err.find("--tensorboard-dir " + file + "/tb"), std::string::npos) << err;
  std::filesystem::remove(file);
}

TEST(TensorBoard, FlagsParseWithMegatronDefaultsAndRanges) {
  const auto base = testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 2, "1e-3");
  const train::TrainConfig d = testing::small_config(base);
  EXPECT_EQ(d.tensorboard_log_interval, 1);
  EXPECT_EQ(d.tensorboard_queue_size, 1000);
  EXPECT_FALSE(d.no_log_loss_scale_to_tensorboard);
  const train::TrainConfig c = testing::small_config(
      base, {"--tensorboard-dir", "tb", "--tensorboard-log-interval", "5", "--tensorboard-queue-size", "0",
             "--log-timers-to-tensorboard", "--no-log-loss-scale-to-tensorboard", "--log-validation-ppl-to-tensorboard",
             "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard"});
  EXPECT_EQ(c.tensorboard_dir, "tb");
  EXPECT_EQ(c.tensorboard_log_interval, 5);
  EXPECT_EQ(c.tensorboard_queue_size, 0);
  EXPECT_TRUE(c.log_timers_to_tensorboard && c.no_log_loss_scale_to_tensorboard &&
              c.log_validation_ppl_to_tensorboard && c.log_memory_to_tensorboard && c.log_world_size_to_tensorboard);
  const std::string err = testing::user_error_of([&] {
    testing::small_config(base, {"--tensorboard-log-interval", "0"});
  });
  EXPECT_NE(err.find("--tensorboard-log-interval"), std::string::npos) << err;
}

}  // namespace
}  // namespace moecore
