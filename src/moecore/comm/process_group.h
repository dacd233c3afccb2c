// ProcessGroup: the collectives moecore's distributed code uses. Host tensors go over MPI; GPU tensors over NCCL
// when every rank owns its GPU (comm/gpu_transport.h; the group's NCCL communicator, comm/nccl_comm.h, on its own
// stream, ordered against the compute stream by events: process_group_nccl.cpp), else through host copies over MPI.
// Every operation has a non-blocking form returning Work to wait on, so communication can overlap computation; the
// blocking form is that plus wait(). On NCCL, waiting orders the caller's current stream after the operation and
// does not block the host; the result is there for any later work on that stream. Tensors are contiguous; rows are
// the leading dimension. Every MPI and NCCL call is checked: a failure throws naming the call and the operation.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moecore/comm/nccl_comm.h"
#include "moecore/comm/rank_generator.h"
#include "moecore/core/tensor.h"

namespace moecore::comm {

enum class ReduceOp { Sum, Max };

// Traffic of one kind of collective on one named group, for `moecore bench comm`: calls, payload bytes (this
// rank's input), bytes this rank must receive under a bandwidth-optimal algorithm (ring all-reduce
// 2(P−1)/P·N; all-gather and all-to-all: the rows coming from other ranks; reduce-scatter (P−1)/P of the input)
// and seconds this rank spent blocked waiting for completion (exposed communication).
struct CommCounter {
  int64_t calls = 0;
  double payload_bytes = 0, received_bytes = 0, blocked_seconds = 0;
};
// Counters keyed "group:operation", accumulated by every rank for its own calls. Not thread-safe (collectives
// are issued by the training thread only).
std::map<std::string, CommCounter>& comm_counters();

// A pending operation. Holds the buffers it needs until completion (count and displacement arrays; on NCCL the
// tensors themselves, so no block is reused under a running transfer). Over MPI it holds a request the host waits
// on under the watchdog; over NCCL the event after the operation, which wait() makes the current stream wait on
// (the NCCL watchdog thread watches it meanwhile).
class Work {
 public:
  Work() = default;
  // Moves hand the request over and leave the source empty (a copied handle would be waited on, and freed, twice).
  Work(Work&& o) noexcept;
  Work& operator=(Work&& o) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();  // waits if still pending: an operation is never abandoned with live buffers
  void wait();
  bool test();  // true when complete
  bool pending() const { return req_ != MPI_REQUEST_NULL || nccl_ != nullptr; }

 private:
  friend class ProcessGroup;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<int> counts_a_, displs_a_, counts_b_, displs_b_;
  const char* what_ = "";
  // The counter its blocked time is charged to, by key (comm_counters() may be cleared while it is in flight).
  std::string counter_;
  // Where this wait is, for the watchdog (comm/watchdog.h): the group's name and world ranks, the group's sequence
  // number of this collective.
  std::shared_ptr<const std::vector<int>> members_;
  std::string group_;
  uint64_t seq_ = 0;
  // A GPU tensor's point-to-point message goes through a host copy (host-staged MPI): staged_ is that copy, kept
  // alive while MPI reads or writes it; for a receive, unstage_to_ is the GPU tensor it is copied into on completion.
  Tensor staged_, unstage_to_;
  // NCCL: the launched operation and the tensors it reads and writes (released once the stream has waited).
  std::shared_ptr<NcclPending> nccl_;
  std::vector<Tensor> keep_;
  int finish();    // polls to completion under the watchdog (MPI) or orders the current stream (NCCL)
  void unstage();  // after completion: a received message copied into its GPU tensor
};

class ProcessGroup {
 public:
  // MPI_Init_thread when not yet initialized (a single process needs no mpirun); idempotent.
  static void init(int* argc, char*** argv);
  static void finalize();
  // After a failure: ends every rank of a multi-rank job (MPI_Abort), so none waits for this one; nothing for a
  // single process or before MPI started.
  static void abort_job_if_shared(int rc);
  static ProcessGroup world();

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  // Collective over this group: every member passes the same `groups` (from ParallelState) and gets the one it
  // belongs to, ranks ordered as in the list. `groups` hold ranks of this group.
  ProcessGroup split(const RankGroups& groups) const;

  Work all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum, bool async = false) const;
  // out [size·rows, ...] = concat over ranks of in [rows, ...]
  Work all_gather(const Tensor& in, Tensor& out, bool async = false) const;
  // out = concat over ranks of in, rank r contributing rows_per_rank[r] rows
  Work all_gather_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows_per_rank, bool async = false) const;
  // out [rows, ...] = reduction over ranks of in's slice for this rank (in [size·rows, ...])
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum, bool async = false) const;
  // In place over one buffer of size·n elements (Megatron's gradient buffer): when the Work completes, this rank's
  // region [rank·n, (rank+1)·n) holds the reduction of every rank's region; the other regions are left undefined.
  Work reduce_scatter_in_place(Tensor& buf, ReduceOp op = ReduceOp::Sum, bool async = false) const;
  // In place over one buffer of size·n elements (Megatron's parameter buffer): every rank's region r receives rank
  // r's region r.
  Work all_gather_in_place(Tensor& buf, bool async = false) const;
  // out [rows_per_rank[me], ...] = reduction over ranks of in's rows for this rank (in: Σ rows_per_rank rows)
  Work reduce_scatter_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows_per_rank,
                        ReduceOp op = ReduceOp::Sum, bool async = false) const;
  // Rows send_rows[r] of in go to rank r (in order); out receives recv_rows[r] rows from rank r (in order).
  Work all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                    const std::vector<int64_t>& recv_rows, bool async = false) const;
  Work broadcast(Tensor& t, int64_t root, bool async = false) const;
  // Point-to-point. Over MPI the tag matches a send to its receive; over NCCL messages between two ranks match in
  // the order they are issued (NCCL has no tags), and a send waits on the GPU until its receive is posted: two
  // ranks that send to each other use send_recv.
  Work send(const Tensor& t, int64_t dst, int tag = 0, bool async = false) const;
  Work recv(Tensor& t, int64_t src, int tag = 0, bool async = false) const;
  // `send_t` to dst and `recv_t` from src as one exchange (a ring step): over NCCL one grouped send and receive,
  // over MPI a send and a receive. Returns {send's Work, receive's Work}.
  std::pair<Work, Work> send_recv(const Tensor& send_t, int64_t dst, Tensor& recv_t, int64_t src, int tag = 0,
                                  bool async = false) const;
  void barrier() const;

  MPI_Comm comm() const { return comm_->c; }
  // Names the group in the traffic counters ("dp", "tp", "ep", ...); unnamed groups count as "group".
  void set_name(const std::string& name) { name_ = name; }
  const std::string& name() const { return name_; }

 private:
  struct Comm {
    MPI_Comm c = MPI_COMM_NULL;
    bool owned = false;
    std::shared_ptr<NcclComm> nccl;  // when the GPU transport is NCCL: made by split, or at the first GPU collective
    std::shared_ptr<const std::vector<int>> world_ranks;  // of the members, in group order (the watchdog's)
    uint64_t seq = 0;                                     // collectives issued on this communicator
    ~Comm();
  };
  explicit ProcessGroup(std::shared_ptr<Comm> c);
  // Charges a call to the counters and points the Work at them; names the wait for the watchdog (`peer` >= 0:
  // a point-to-point operation with that group rank).
  void count(Work& w, const char* op, double payload, double received, int64_t peer = -1) const;
  // The group's NCCL communicator when a tensor is on the GPU and the GPU transport is NCCL (made here at the first
  // such collective; `collective` false: a point-to-point call, which cannot make one for a group of more than two
  // ranks), else null: host tensors go over MPI, GPU tensors through host copies.
  const std::shared_ptr<NcclComm>* nccl_for(const Tensor& a, const Tensor& b, bool collective) const;
  NcclSite site(const Work& w) const;
  static std::shared_ptr<NcclComm> shared_nccl_comm(MPI_Comm c, const std::vector<int>& members,
                                                    const std::string& name);
  // The NCCL paths of the operations above (process_group_nccl.cpp).
  Work nccl_all_reduce(Tensor& t, ReduceOp op, bool async) const;
  Work nccl_all_gather(const Tensor& in, Tensor& out, bool async) const;
  Work nccl_all_gather_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows, bool async) const;
  Work nccl_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) const;
  Work nccl_reduce_scatter_in_place(Tensor& buf, ReduceOp op, bool async) const;
  Work nccl_all_gather_in_place(Tensor& buf, bool async) const;
  Work nccl_reduce_scatter_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows, ReduceOp op,
                             bool async) const;
  Work nccl_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                         const std::vector<int64_t>& recv_rows, bool async) const;
  Work nccl_broadcast(Tensor& t, int64_t root, bool async) const;
  Work nccl_send_recv(const Tensor* send_t, int64_t dst, Tensor* recv_t, int64_t src, bool async) const;
  std::shared_ptr<Comm> comm_;
  int64_t rank_ = 0, size_ = 1;
  std::string name_ = "group";
};

}  // namespace moecore::comm
