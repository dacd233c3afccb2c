// NCCL between GPUs: one communicator per ProcessGroup whose members each own a GPU, created from MPI, with its
// own stream. Plain host declarations (no NCCL or CUDA header), so ProcessGroup includes it in every build; a
// build with CUDA and NCCL implements it in nccl_comm.cpp, any other in nccl_comm_unavailable.cpp (nothing is
// ever created there). Not the choice of transport (comm/gpu_transport.h) nor the collectives' shapes
// (process_group.cpp): these are launches on raw device pointers.
//
// Ordering: every launch records an event on the caller's current (compute) stream and makes the group's stream
// wait on it, so NCCL reads what the compute stream wrote; after the NCCL call(s) an event is recorded on the
// group's stream, and NcclPending::wait makes the then-current stream wait on it. Neither blocks the host.
// Every launched operation is watched by the NCCL watchdog (nccl_fault.h) until its event completes.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/dtype.h"

namespace moecore::comm {

bool built_with_nccl();

class NcclComm;     // a communicator, its GPU and its stream
class NcclPending;  // a launched operation: the event after it

// Collective over `c` (every member calls it, on the GPU it owns, made current): group rank 0 makes the unique id
// (ncclGetUniqueId), MPI_Bcast over `c`, ncclCommInitRank. `group` names it in errors.
std::shared_ptr<NcclComm> nccl_comm_create(MPI_Comm c, const std::string& group);

// What the watchdog names if the operation fails or hangs.
struct NcclSite {
  std::string group, op;
  std::vector<int> members;  // world ranks
  uint64_t seq = 0;
};

// One row block to or from a peer (group rank) of a grouped send/receive.
struct NcclPeerBuffer {
  int peer = 0;
  void* ptr = nullptr;
  size_t count = 0;  // elements
};

// The launches. `max` false: sum. Counts are elements of `dtype`; bf16 is reduced as bf16 (moecore only moves
// bf16 tensors, as over MPI).
std::shared_ptr<NcclPending> nccl_all_reduce(const std::shared_ptr<NcclComm>& cp, void* buf, size_t count, DType dtype,
                                             bool max, NcclSite site);
std::shared_ptr<NcclPending> nccl_all_gather(const std::shared_ptr<NcclComm>& cp, const void* in, void* out,
                                             size_t count_per_rank, DType dtype, NcclSite site);
std::shared_ptr<NcclPending> nccl_reduce_scatter(const std::shared_ptr<NcclComm>& cp, const void* in, void* out,
                                                 size_t count_per_rank, DType dtype, bool max, NcclSite site);
std::shared_ptr<NcclPending> nccl_broadcast(const std::shared_ptr<NcclComm>& cp, void* buf, size_t count, DType dtype,
                                            int root, NcclSite site);
// Sends and receives in one ncclGroupStart/End (all-to-all-v, all-gather-v, point-to-point).
std::shared_ptr<NcclPending> nccl_send_recv(const std::shared_ptr<NcclComm>& cp,
                                            const std::vector<NcclPeerBuffer>& sends,
                                            const std::vector<NcclPeerBuffer>& recvs, DType dtype, NcclSite site);

// The current stream waits for the operation (no host block).
void nccl_wait(const NcclPending& p);
// True when the operation has completed on the GPU (cudaEventQuery; no block).
bool nccl_done(const NcclPending& p);

// Stops the watchdog thread (ProcessGroup::finalize).
void nccl_shutdown();

}  // namespace moecore::comm
