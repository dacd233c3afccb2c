// What every layout-invariance test (tests/mpi/) checks: the same tiny job on one rank and under a parallel layout
// gives, step by step, the one-rank LM loss, gradient norm, aux losses and z-loss within `rel` relative.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore::testing {

// One step's figures of the parallel run `b` against the single-rank run `a`.
inline void expect_same_step(const train::StepResult& a, const train::StepResult& b, int step, double rel = 1e-5) {
  EXPECT_NEAR(b.lm_loss, a.lm_loss, rel * std::fabs(a.lm_loss)) << "step " << step;
  EXPECT_NEAR(b.grad_norm, a.grad_norm, rel * a.grad_norm) << "step " << step;
  ASSERT_EQ(a.aux_losses.size(), b.aux_losses.size());
  for (size_t t = 0; t < a.aux_losses.size(); t++)
    EXPECT_NEAR(b.aux_losses[t], a.aux_losses[t], rel * std::fabs(a.aux_losses[t])) << "step " << step;
  EXPECT_NEAR(b.z_loss, a.z_loss, rel * std::fabs(a.z_loss)) << "step " << step;
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

}  // namespace moecore::testing
