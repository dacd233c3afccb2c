// ProcessGroup: the collectives moecore's distributed code uses, over MPI (NCCL later, behind the same
// interface). Every operation has a non-blocking form returning Work to wait on, so communication can overlap
// computation; the blocking form is that plus wait(). Tensors are contiguous; rows are the leading dimension.
// Every MPI call is checked: a failure throws with the MPI error string and the operation's name.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// A pending operation. Holds the buffers it needs until completion (count and displacement arrays).
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
  bool pending() const { return req_ != MPI_REQUEST_NULL; }

 private:
  friend class ProcessGroup;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<int> counts_a_, displs_a_, counts_b_, displs_b_;
  const char* what_ = "";
  CommCounter* counter_ = nullptr;  // blocked time is charged here
  // Where this wait is, for the watchdog (comm/watchdog.h): the group's name and world ranks, the group's sequence
  // number of this collective.
  std::shared_ptr<const std::vector<int>> members_;
  std::string group_;
  uint64_t seq_ = 0;
  // A GPU tensor's point-to-point message goes through a host copy (host-staged MPI): staged_ is that copy, kept
  // alive while MPI reads or writes it; for a receive, unstage_to_ is the GPU tensor it is copied into on completion.
  Tensor staged_, unstage_to_;
  int finish();    // polls to completion under the watchdog; the MPI status code
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
  Work send(const Tensor& t, int64_t dst, int tag = 0, bool async = false) const;
  Work recv(Tensor& t, int64_t src, int tag = 0, bool async = false) const;
  void barrier() const;

  MPI_Comm comm() const { return comm_->c; }
  // Names the group in the traffic counters ("dp", "tp", "ep", ...); unnamed groups count as "group".
  void set_name(const std::string& name) { name_ = name; }
  const std::string& name() const { return name_; }

 private:
  struct Comm {
    MPI_Comm c = MPI_COMM_NULL;
    bool owned = false;
    std::shared_ptr<const std::vector<int>> world_ranks;  // of the members, in group order (the watchdog's)
    uint64_t seq = 0;                                     // collectives issued on this communicator
    ~Comm();
  };
  explicit ProcessGroup(std::shared_ptr<Comm> c);
  // Charges a call to the counters and points the Work at them; names the wait for the watchdog (`peer` >= 0:
  // a point-to-point operation with that group rank).
  void count(Work& w, const char* op, double payload, double received, int64_t peer = -1) const;
  std::shared_ptr<Comm> comm_;
  int64_t rank_ = 0, size_ = 1;
  std::string name_ = "group";
};

}  // namespace moecore::comm
