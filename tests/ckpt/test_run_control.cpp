// Run control in one process: --exit-duration-in-mins stops at a step boundary with a checkpoint (the process clock
// moved back through run_control's testing hook); --async-save trains bitwise like a synchronous save, writes the
// same bytes and moves the marker only when the save is committed; --save-retain-interval and
// --keep-last-checkpoints delete only checkpoints this run wrote, never the loaded one nor the newest; Megatron's
// check that the retain interval is a multiple of --save-interval; the riders of the stop all-reduce, summed over
// ranks, give every rank the same decisions; a SIGCONT that resumes nothing (Open MPI's kill sequence) requests the
// stop at once, one that resumes a stop does not.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "config_util.h"
#include "moecore/ckpt/manager.h"
#include "moecore/core/file.h"
#include "moecore/train/run_control.h"
#include "moecore/train/signals.h"
#include "moecore/train/stop_riders.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::operator+;

std::vector<std::string> args(int64_t iters) {
  return testing::tiny_moe_flags() +
         std::vector<std::string>{"--lr-decay-style", "constant", "--lr-decay-iters", "100", "--log-interval", "100"} +
         testing::mock_run_flags(16, 2, 4, 100, iters, "3e-3");
}

std::vector<int64_t> iterations_in(const std::string& dir) {
  std::vector<int64_t> out;
  for (const auto& [it, d] : ckpt::complete_checkpoints(dir)) out.push_back(it);
  return out;
}

std::string marker(const std::string& dir) {
  const std::string m = dir + "/" + ckpt::kLatestFile;
  return fs::exists(m) ? read_file(m, "marker") : "(none)";
}

TEST(RunControl, ExitDurationSavesAndStopsAtAStepBoundary) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("runcontrol_duration");
  train::Trainer t(testing::small_config(args(6), {"--save", dir, "--exit-duration-in-mins", "1"}), null.f, false);
  train::set_process_start_minutes_ago(2);  // the process has run for 2 minutes: past the limit at once
  t.run();
  train::set_process_start_minutes_ago(0);
  EXPECT_EQ(t.iteration(), 1);  // the first step boundary, as Megatron checks after each step
  EXPECT_EQ(marker(dir), "1");
  EXPECT_EQ(iterations_in(dir), std::vector<int64_t>{1});
  // Not yet past the limit: the run goes to --train-iters.
  const std::string dir2 = testing::fresh_temp_path("runcontrol_duration_not_yet");
  train::Trainer u(testing::small_config(args(3), {"--save", dir2, "--exit-duration-in-mins", "60"}), null.f, false);
  u.run();
  EXPECT_EQ(u.iteration(), 3);
}

TEST(RunControl, AsyncSaveIsBitwiseAndCommitsAtALaterStepBoundary) {
  testing::NullOut null;
  const std::string sync_dir = testing::fresh_temp_path("runcontrol_sync"),
                    async_dir = testing::fresh_temp_path("runcontrol_async");
  train::Trainer s(testing::small_config(args(60), {"--save", sync_dir}), null.f, false);
  train::Trainer a(testing::small_config(args(60), {"--save", async_dir, "--async-save"}), null.f, false);
  for (int i = 1; i <= 6; i++) {
    const train::StepResult rs = s.train_step(), ra = a.train_step();
    EXPECT_EQ(rs.lm_loss, ra.lm_loss) << "step " << i;
    EXPECT_EQ(rs.grad_norm, ra.grad_norm) << "step " << i;
    if (i == 2 || i == 4) {
      s.save_checkpoint();
      a.save_checkpoint();
      // The async save is not visible yet: the marker names the previous save (or none).
      EXPECT_EQ(marker(async_dir), i == 2 ? "(none)" : "2") << "step " << i;
      EXPECT_EQ(marker(sync_dir), std::to_string(i));
    }
  }
  // A step boundary after the save commits it once every rank's files are written (a tiny model's writer is done
  // within a step or two; more steps only for a slow disk).
  for (int i = 7; i < 60 && marker(async_dir) != "4"; i++) a.train_step();
  EXPECT_EQ(marker(async_dir), "4");
  for (int it : {2, 4}) {
    const std::string f = "/model_rank00000.safetensors";
    EXPECT_EQ(read_file(ckpt::iteration_dir(sync_dir, it) + f, "sync"),
              read_file(ckpt::iteration_dir(async_dir, it) + f, "async"))
        << "iteration " << it;
  }
  EXPECT_FALSE(fs::exists(ckpt::iteration_dir(async_dir, 4) + ".tmp"));
}

TEST(RunControl, AsyncSaveInFlightIsFinishedAtTheEnd) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("runcontrol_async_end");
  train::Trainer a(testing::small_config(args(3), {"--save", dir, "--async-save", "--save-interval", "3"}), null.f,
                   false);
  a.run();  // saves iteration 3 in the background at the last step, then finishes it before returning
  EXPECT_EQ(marker(dir), "3");
  EXPECT_EQ(iterations_in(dir), std::vector<int64_t>{3});
}

TEST(RunControl, RetentionDeletesOnlyThisRunsOlderCheckpoints) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("runcontrol_retain");
  {
    train::Trainer t(
        testing::small_config(args(5), {"--save", dir, "--save-interval", "1", "--save-retain-interval", "2"}), null.f,
        false);
    t.run();
  }
  EXPECT_EQ(iterations_in(dir), (std::vector<int64_t>{2, 4, 5}));  // multiples of 2 and the newest
  {
    // Resumed from iteration 5 (not a multiple of 2): the loaded checkpoint is not this run's, so it stays.
    train::Trainer t(testing::small_config(args(8), {"--save", dir, "--load", dir, "--save-interval", "1",
                                                     "--save-retain-interval", "2", "--async-save"}),
                     null.f, false);
    t.run();
  }
  EXPECT_EQ(iterations_in(dir), (std::vector<int64_t>{2, 4, 5, 6, 8}));
  EXPECT_EQ(marker(dir), "8");
  const std::string last = testing::fresh_temp_path("runcontrol_keep_last");
  {
    train::Trainer t(
        testing::small_config(args(5), {"--save", last, "--save-interval", "1", "--keep-last-checkpoints", "2"}),
        null.f, false);
    t.run();
  }
  EXPECT_EQ(iterations_in(last), (std::vector<int64_t>{4, 5}));
  for (const auto& e : fs::directory_iterator(last))
    EXPECT_EQ(e.path().filename().string().find(".deleted"), std::string::npos) << e.path();
}

TEST(RunControl, RetainIntervalMustBeAMultipleOfTheSaveInterval) {
  const std::string dir = testing::fresh_temp_path("runcontrol_retain_check");
  const std::string e = testing::user_error_of([&] {
    testing::small_config(args(4), {"--save", dir, "--save-interval", "2", "--save-retain-interval", "3"});
  });
  EXPECT_NE(e.find("--save-retain-interval 3 must be a multiple of --save-interval 2"), std::string::npos) << e;
  const std::string s = testing::user_error_of([&] { testing::small_config(args(4), {"--testing-stall", "1:2"}); });
  EXPECT_NE(s.find("--testing-stall expects RANK:ITERATION:SECONDS"), std::string::npos) << s;
}

TEST(RunControl, ExitSignalTakesCatchableSignalsByName) {
  EXPECT_EQ(train::StopSignals::parse("SIGQUIT"), SIGQUIT);
  EXPECT_EQ(train::StopSignals::parse("SIGALRM"), SIGALRM);
  EXPECT_EQ(train::StopSignals::parse("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(train::StopSignals::parse("SIGKILL"), 0);
  testing::small_config(args(4), {"--exit-signal-handler", "--exit-signal", "SIGQUIT"});
  const std::string e = testing::user_error_of([&] {
    testing::small_config(args(4), {"--exit-signal-handler", "--exit-signal", "SIGSEGV"});
  });
  EXPECT_NE(e.find("--exit-signal SIGSEGV is not a signal a handler can catch and return from; one of: SIGTERM"),
            std::string::npos)
      << e;
}

// Open MPI's kill sequence starts with a SIGCONT to running ranks: a stop request as soon as the handler returns.
// A SIGCONT that resumes a stop (a scheduler's SIGSTOP, or Ctrl-Z through mpirun) lets training go on.
TEST(RunControl, ASigcontThatResumesNothingRequestsTheStopAtOnce) {
  bool at_once = false;
  for (int attempt = 0; attempt < 5 && !at_once; attempt++) {  // a loaded machine may keep the ticker off the CPU
    const train::StopSignals s({SIGTERM}, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    std::raise(SIGCONT);  // handled before raise returns
    at_once = train::StopSignals::requested() == train::StopSignals::kKillSequence;
  }
  EXPECT_TRUE(at_once);
  const train::StopSignals s({SIGTERM}, true);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const pid_t parent = ::getpid(), child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // resumes the stopped test a second later
    ::sleep(1);
    ::kill(parent, SIGCONT);
    ::_exit(0);
  }
  std::raise(SIGSTOP);
  ::waitpid(child, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the handler may run on another thread
  EXPECT_EQ(train::StopSignals::requested(), 0);
}

TEST(RunControl, StopRidersSummedOverRanksGiveEveryRankTheSameDecision) {
  // Three ranks, as the all-reduce sums them: rank 1 got SIGUSR1, rank 2 is past the duration, ranks 0 and 1 have
  // written their background-save files.
  const train::StopRiders ranks[] = {train::StopRiders::of_rank(0, false, true),
                                     train::StopRiders::of_rank(SIGUSR1, false, true),
                                     train::StopRiders::of_rank(0, true, false)};
  std::array<double, train::StopRiders::kCount> sum{};
  for (const auto& r : ranks) {
    const auto p = r.packed();
    for (size_t i = 0; i < sum.size(); i++) sum[i] += p[i];
  }
  const auto all = train::StopRiders::unpacked(sum);
  EXPECT_EQ(all.stop_signal(0), SIGUSR1);  // ranks without a signal stop on the one another rank received
  EXPECT_EQ(all.stop_signal(SIGUSR1), SIGUSR1);
  EXPECT_TRUE(all.past_duration());
  EXPECT_FALSE(all.async_written_everywhere(3));
  EXPECT_TRUE(all.async_written_everywhere(2));
  // Nothing requested anywhere: no stop, no exit.
  const auto none = train::StopRiders::unpacked(train::StopRiders::of_rank(0, false, false).packed());
  EXPECT_EQ(none.stop_signal(0), 0);
  EXPECT_FALSE(none.past_duration());
  // Two ranks that received the same signal stop on it.
  auto two = train::StopRiders::of_rank(SIGTERM, false, false).packed();
  for (size_t i = 0; i < two.size(); i++) two[i] *= 2;
  EXPECT_EQ(train::StopRiders::unpacked(two).stop_signal(0), SIGTERM);
}

}  // namespace
}  // namespace moecore
