// Which device a training run uses (--device auto|cpu|cuda[:N]) and what the GPU path does not cover: a run that
// would use a GPU (--device cuda, or auto where a GPU is visible) with such a feature is refused before any work,
// naming it. auto never moves a run to the CPU when a GPU is visible: a user with a GPU did not ask for a CPU run
// (docs/cuda.md lists what runs on the GPU, docs/differences.md why the rest does not).
#pragma once

#include <string>

#include "moecore/core/device.h"
#include "moecore/device/device_select.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

// The first setting of `c` that GPU training does not support, as a sentence naming the flag; empty when none.
std::string gpu_training_gap(const TrainConfig& c);

// The device the run trains on, given what this process can use: --device resolved (refused when unusable); where
// that is a GPU (cuda, cuda:N, or auto with a GPU visible), refused with gpu_training_gap's reason when it is not
// empty. A pure function of its arguments: testable without a GPU.
Device training_device(const TrainConfig& c, const device::DeviceAvailability& available);
// The same for this process's real availability (for a plan, c.plan_only: the GPU --device names, assumed).
Device training_device(const TrainConfig& c);

// Whether activation offloading moves anything on `d`: a GPU's stashes go to host memory; a CPU's are there already.
bool offloading_applies(Device d);

}  // namespace moecore::train
