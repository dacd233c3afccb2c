// What every layout-invariance test (tests/mpi/) checks: the same tiny job on one rank and under a parallel layout
// gives, step by step, the one-rank LM loss, gradient norm, aux losses and z-loss within `rel` relative.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore::testing {

// A scratch directory every rank of `w` sees (named with rank 0's process id, so two runs never share it), emptied
// by rank 0.
inline std::string mpi_shared_dir(const comm::ProcessGroup& w, const std::string& name) {
  Tensor pid = Tensor::empty({1}, DType::I64);
  pid.set_item(0, static_cast<double>(::getpid()));
  w.broadcast(pid, 0);
  const std::string d = (std::filesystem::temp_directory_path() /
                         fmt::format("moecore_mpi_{}_{}_{}", name, w.size(), static_cast<int64_t>(pid.item(0))))
                            .string();
  if (w.rank() == 0) std::filesystem::remove_all(d);
  w.barrier();
  return d;
}

// One step's figures of the parallel run `b` against the single-rank run `a`.
inline void expect_same_step(const train::StepResult& a, const train::StepResult& b, int step, double rel = 1e-5) {
  EXPECT_NEAR(b.lm_loss, a.lm_loss, rel * std::fabs(a.lm_loss)) << "step " << step;
  EXPECT_NEAR(b.grad_norm, a.grad_norm, rel * a.grad_norm) << "step " << step;
  ASSERT_EQ(a.aux_losses.size(), b.aux_losses.size());
  for (size_t t = 0; t < a.aux_losses.size(); t++)
    EXPECT_NEAR(b.aux_losses[t], a.aux_losses[t], rel * std::fabs(a.aux_losses[t])) << "step " << step;
  EXPECT_NEAR(b.z_loss, a.z_loss, rel * std::fabs(a.z_loss)) << "step " << step;
  ASSERT_EQ(a.mtp_losses.size(), b.mtp_losses.size());
  for (size_t k = 0; k < a.mtp_losses.size(); k++)
    EXPECT_NEAR(b.mtp_losses[k], a.mtp_losses[k], rel * std::fabs(a.mtp_losses[k]))
        << "step " << step << " mtp_" << k + 1;
}

// Trains `one` on a single rank and `multi` over `w` for `steps` steps (output discarded); every step must agree.
inline void expect_same_steps(const train::TrainConfig& one, const train::TrainConfig& multi,
                              const comm::ProcessGroup& w, int steps = 5, double rel = 1e-5) {
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer single(one, null, false, nullptr), parallel(multi, null, false, &w);
    for (int step = 0; step < steps; step++) expect_same_step(single.train_step(), parallel.train_step(), step, rel);
  }
  std::fclose(null);
}

// Five steps straight, then two steps, a save to `dir` and a resume for three more: the resumed steps must equal the
// straight run's bitwise. `config(extra)` is the run's configuration with the flags `extra` added.
inline void expect_bitwise_resume(const std::function<train::TrainConfig(const std::vector<std::string>&)>& config,
                                  const std::string& dir, const comm::ProcessGroup& w) {
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> want;
  {
    train::Trainer straight(config({}), null, false, &w);
    for (int i = 0; i < 5; i++) want.push_back(straight.train_step());
  }
  {
    train::Trainer first(config({"--save", dir}), null, false, &w);
    for (int i = 0; i < 2; i++) first.train_step();
    first.save_checkpoint();
  }
  train::Trainer resumed(config({"--load", dir}), null, false, &w);
  ASSERT_EQ(resumed.iteration(), 2);
  for (size_t i = 2; i < 5; i++) {
    const auto r = resumed.train_step();
    EXPECT_EQ(r.lm_loss, want[i].lm_loss) << "step " << i;
    EXPECT_EQ(r.grad_norm, want[i].grad_norm) << "step " << i;
    EXPECT_EQ(r.aux_losses, want[i].aux_losses) << "step " << i;
  }
  std::fclose(null);
}

}  // namespace moecore::testing
