// How GPU tensors travel between ranks, decided once per job at start: NCCL when every rank owns its GPU (one GPU
// per rank, cuda:<local rank>) and the build has NCCL, else host-staged MPI (ranks that share a GPU). Host tensors
// always go over MPI. Not the operations themselves (process_group.cpp, process_group_nccl.cpp).
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include "moecore/core/device.h"

namespace moecore::comm {

enum class GpuTransport { HostStaged, Nccl };
// The job's transport (HostStaged until place_ranks_on_gpus chooses). Every rank holds the same value.
GpuTransport gpu_transport();
// For tests that compare the two transports on the same ranks; every rank must set the same value.
void set_gpu_transport(GpuTransport t);

// This rank's place among the ranks of its node: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) of `world`
// (collective over `world`).
struct LocalRank {
  int rank = 0, size = 1;
};
LocalRank local_rank(MPI_Comm world);

// Collective over `world`, at start: resolves --device `requested` for `command` on every rank, places this rank on
// its GPU (device/device_select.h place_on_gpu), makes it the current device and sets the job's transport (NCCL only
// when every rank can). A rank that cannot use the device makes every rank throw the same Error, naming that rank
// and its reason. Returns the device (the CPU for cpu or auto without a GPU) and, in `line`, the one line the job
// prints (empty on the CPU).
Device place_ranks_on_gpus(std::string_view requested, std::string_view command, MPI_Comm world, std::string* line);

}  // namespace moecore::comm
