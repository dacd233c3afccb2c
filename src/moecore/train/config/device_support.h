// Which device a training run uses (--device auto|cpu|cuda[:N]) and what the GPU path does not cover yet: an
// explicit --device cuda with such a feature is refused before any work, naming it; --device auto falls back to
// the CPU and says why (docs/cuda.md lists what runs on the GPU).
#pragma once

#include <string>

#include "moecore/core/device.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

// The first setting of `c` that GPU training does not support, as a sentence naming the flag; empty when none.
std::string gpu_training_gap(const TrainConfig& c);

// The device the run trains on: --device resolved (refused when unusable), a GPU only when gpu_training_gap is
// empty. `why_cpu` receives the reason when auto falls back to the CPU although a GPU is visible.
Device training_device(const TrainConfig& c, std::string* why_cpu = nullptr);

}  // namespace moecore::train
