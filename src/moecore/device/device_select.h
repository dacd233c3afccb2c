// --device auto|cpu|cuda[:N] on train, generate and bench: parsing and the choice, refused before any work.
#pragma once

#include <string>
#include <string_view>

#include "moecore/core/device.h"

namespace moecore::device {

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

// One GPU per rank (Megatron's LOCAL_RANK): where a rank of a multi-rank job runs and how its GPU tensors travel.
// `cuda` and `auto` mean cuda:<local rank> when the node has at least as many visible GPUs as local ranks; with
// fewer, ranks share GPUs (local rank modulo the visible count) and GPU tensors go through host-staged MPI (NCCL
// wants one GPU per rank). `cuda:N` pins GPU N on every local rank (shared when the node runs more than one rank).
struct GpuPlacement {
  int device = 0;         // the GPU index this rank uses
  bool owns_gpu = false;  // no other local rank uses it
  bool nccl = false;      // GPU tensors go over NCCL (every rank owns its GPU and the build has NCCL)
};
// Pure: local rank and local ranks on this node, the GPUs this process sees, `requested` (cuda, cuda:N, auto),
// whether the build has NCCL. The transport is this rank's view; the job's is the AND over every rank
// (comm/gpu_transport.h agrees on it).
GpuPlacement place_on_gpu(int local_rank, int local_size, int visible, std::string_view requested, bool nccl_built);
// The one line a job prints at start: "8 ranks on this node, one GPU each (cuda:<local rank>): NCCL between GPUs".
std::string describe_placement(const GpuPlacement& p, int local_size, int visible, bool job_nccl, bool nccl_built);

}  // namespace moecore::device
