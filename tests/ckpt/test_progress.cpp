// Progress of long work other than training (core/progress.h) as ckpt/ shows it: quick work prints nothing; with
// the test-only MOECORE_TEST_PROGRESS_SECONDS=0 a checkpoint save and load (not on a terminal: stderr is captured)
// print plain percentage lines with MB/s and ETA, then a final summary.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/progress.h"
#include "test_util.h"

namespace moecore {
namespace {

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
  return n;
}

std::vector<ckpt::StoredTensor> tensors() {
  std::vector<ckpt::StoredTensor> ts;
  for (int i = 0; i < 4; i++) {
    Tensor t = Tensor::zeros({256, 64}, DType::F32);
    t.set_item(i, 1.0 + i);
    ts.push_back({"t" + std::to_string(i), ckpt::whole_box(t.shape()), t});
  }
  return ts;
}

TEST(Progress, QuickSaveAndLoadPrintNothing) {
  unsetenv("MOECORE_TEST_PROGRESS_SECONDS");
  const std::string dir = testing::fresh_temp_path("progress_quiet");
  std::filesystem::create_directories(dir);
  auto ts = tensors();
  ::testing::internal::CaptureStderr();
  ckpt::write_shards(dir, 0, ts);
  ckpt::write_model_index(dir, 1);
  Tensor back = Tensor::empty({256, 64}, DType::F32);
  ckpt::load_tensors(dir, {ckpt::LoadTarget{"t2", ckpt::whole_box(back.shape()), &back}});
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(back.item(2), 3.0);
  std::filesystem::remove_all(dir);
}

TEST(Progress, PlainLinesAndSummaryWhenShown) {
  setenv("MOECORE_TEST_PROGRESS_SECONDS", "0", 1);
  const std::string dir = testing::fresh_temp_path("progress_shown");
  std::filesystem::create_directories(dir);
  auto ts = tensors();
  ::testing::internal::CaptureStderr();
  ckpt::write_shards(dir, 0, ts);
  const std::string other = testing::fresh_temp_path("progress_other");
  std::filesystem::create_directories(other);
  ckpt::write_shards(other, 1, ts);  // another rank's files: rank 0 alone shows its save
  std::string err = ::testing::internal::GetCapturedStderr();
  // One plain line per tensor (percent, rate, elapsed, ETA), then the summary naming the file.
  EXPECT_EQ(count_of(err, "checkpoint save: "), 5) << err;
  EXPECT_NE(err.find("checkpoint save: 25.0% "), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint save: 100.0% "), std::string::npos) << err;
  EXPECT_NE(err.find(" MB/s elapsed "), std::string::npos) << err;
  EXPECT_NE(err.find(" ETA "), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint save: 0.3 MB in "), std::string::npos) << err;
  EXPECT_NE(err.find("model_rank00000.safetensors"), std::string::npos) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << "not a terminal: no redrawn line";
  ckpt::write_model_index(dir, 1);
  std::vector<Tensor> back;  // each its own storage (a Tensor copy shares it)
  for (int i = 0; i < 4; i++) back.push_back(Tensor::empty({256, 64}, DType::F32));
  std::vector<ckpt::LoadTarget> targets;
  for (int i = 0; i < 4; i++) targets.push_back({"t" + std::to_string(i), ckpt::whole_box(back[0].shape()), &back[i]});
  ::testing::internal::CaptureStderr();
  ckpt::load_tensors(dir, targets);
  err = ::testing::internal::GetCapturedStderr();
  unsetenv("MOECORE_TEST_PROGRESS_SECONDS");
  EXPECT_EQ(count_of(err, "checkpoint load: "), 5) << err;
  EXPECT_NE(err.find("checkpoint load: 75.0% "), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint load: 0.3 MB in "), std::string::npos) << err;
  for (int i = 0; i < 4; i++) EXPECT_EQ(back[i].item(i), 1.0 + i);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

TEST(Progress, FormatDurationAsTrainingShowsIt) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(61.4), "1:01");
  EXPECT_EQ(format_duration(3725), "1:02:05");
}

}  // namespace
}  // namespace moecore
