// --device auto|cpu|cuda[:N] on train, generate and bench: parsing and the choice, refused before any work.
#pragma once

#include <string>
#include <string_view>

#include "moecore/core/device.h"

namespace moecore::cuda {

// What this process can use: whether the build has CUDA and how many GPUs it sees (why when none).
struct DeviceAvailability {
  bool built_with_cuda = false;
  int visible = 0;
  std::string why_none;
  static DeviceAvailability probe();  // the real one (cudaGetDeviceCount in a CUDA build)
  // What a plan made without the hardware assumes (`moecore plan --device cuda:N` on any machine): a CUDA build with
  // the GPU `requested` names visible; auto and cpu keep this process's real availability.
  static DeviceAvailability assumed_for(std::string_view requested);
};

// The accepted spellings of --device.
bool is_device_name(std::string_view s);  // auto, cpu, cuda, cuda:N
// auto: the GPU when the build has CUDA and one is visible, else the CPU. cuda / cuda:N: refused (Error naming
// --device, the value and what to do instead) in a CPU-only build, without a visible GPU, or N out of range.
// `command` names the command in the message ("train", "bench gemm").
Device resolve_device(std::string_view requested, std::string_view command, const DeviceAvailability& a);
inline Device resolve_device(std::string_view requested, std::string_view command) {
  return resolve_device(requested, command, DeviceAvailability::probe());
}

}  // namespace moecore::cuda
