// The trainer's side of loading at start-up: what --load, --load-hf and --moe-use-upcycling find before the model
// is built, and loading it into the model, the optimizer and the run's progress with Megatron's resume rules (the
// model and learning-rate schedule must match, --finetune, --no-load-optim, --no-load-rng). Not saving
// (checkpoint_save.h) nor the files (ckpt/).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/train/checkpoint_save.h"

namespace moecore::train {

// What start-up will load, found before the model is built (a loaded model keeps its vocabulary padding).
struct StartPoint {
  std::optional<ckpt::FoundCheckpoint> checkpoint;  // --load, when it holds one
  std::unique_ptr<ckpt::HFModel> hf;                // --load-hf, when --load holds no checkpoint
  int64_t vocab_rows = 0;                           // the saved model's vocabulary rows (0: unknown)
  std::vector<std::string> set_aside;               // uncommitted saves of --save set aside, one line each
};
// Collective over `world` (null: one process) when --save holds uncommitted saves (ckpt/manager.h).
StartPoint find_start_point(const TrainConfig& c, const comm::ProcessGroup* world = nullptr);

// Start-up from `start` (see TrainConfig: --load, --load-hf, --moe-use-upcycling) into the model and optimizer of
// `state` and into `p`. `saver` (null for a model that is never saved, as in generation; the trainer's saver is
// `state` too) learns where the run starts, checks --save before the first step, and saves an upcycled model at
// once. Returns where the state came from: a checkpoint directory, an HF directory, or empty (fresh init).
std::string load_at_start(const CheckpointedState& state, StartPoint& start, Progress& p,
                          CheckpointSaver* saver = nullptr);

}  // namespace moecore::train
