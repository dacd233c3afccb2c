// Run control around the training loop: the collective timeout taken from the flags (--distributed-timeout-minutes,
// or --testing-collective-timeout-seconds), the process clock --exit-duration-in-mins reads (Megatron's
// _TRAIN_START_TIME: the start of the process), and the testing stall (--testing-stall) that provokes a timeout.
// Not the agreement on stopping nor the saves: those are the trainer's and checkpointing's.
#pragma once

#include <cstdint>

#include "moecore/train/config/config.h"

namespace moecore::train {

// Sets the collective watchdog's timeout from `c` (call after MPI starts, before the first collective).
void configure_collective_timeout(const TrainConfig& c);

// Minutes since this process started (static initialization).
double minutes_since_process_start();
// Tests: pretend the process started `minutes` ago.
void set_process_start_minutes_ago(double minutes);

// --testing-stall RANK:ITERATION:SECONDS: sleeps when `world_rank` is RANK and the step about to run ends at
// ITERATION (it is ITERATION - 1 now).
void maybe_stall(const TrainConfig& c, int64_t world_rank, int64_t iteration_now);

}  // namespace moecore::train
