// NCCL communicators, launches and the NCCL watchdog thread (see nccl_comm.h). Built only with CUDA and NCCL.
#include "moecore/comm/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "moecore/comm/mpi_check.h"
#include "moecore/comm/nccl_fault.h"
#include "moecore/comm/watchdog.h"
#include "moecore/core/error.h"
#include "moecore/core/timer.h"
#include "moecore/device/check.h"
#include "moecore/device/stream.h"

namespace moecore::comm {

namespace {
[[noreturn]] void throw_nccl_error(const char* call, ncclResult_t r, ncclComm_t comm, const std::string& group) {
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  throw Error(fmt::format("NCCL {} failed on the {} group: {} ({}{}{})", call, group, ncclGetErrorString(r),
                          static_cast<int>(r), last && *last ? "; " : "", last ? last : ""));
}
}  // namespace

#define MOE_NCCL_CHECK(call, nccl_comm_, group_)                                 \
  do {                                                                           \
    const ncclResult_t moe_nccl_r_ = (call);                                     \
    if (moe_nccl_r_ != ncclSuccess && moe_nccl_r_ != ncclInProgress)             \
      ::moecore::comm::throw_nccl_error(#call, moe_nccl_r_, nccl_comm_, group_); \
  } while (0)

class NcclComm {
 public:
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  std::string group;
  std::atomic<bool> aborted{false};
  ~NcclComm() {
    if (comm && !aborted.load()) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
};

class NcclPending {
 public:
  std::shared_ptr<NcclComm> comm;
  cudaEvent_t done = nullptr;
  NcclSite site;
  double issued_at = 0;
  ~NcclPending() {
    if (done) cudaEventDestroy(done);
  }
};

bool built_with_nccl() {
  return true;
}

namespace {
// The watchdog's view: every launched operation until its event completes, and every communicator (to abort).
struct NcclWatch {
  std::mutex mu;
  std::vector<std::shared_ptr<NcclPending>> in_flight;
  std::vector<std::weak_ptr<NcclComm>> comms;
  std::thread thread;
  std::atomic<bool> stop{false};
  bool started = false;
};
NcclWatch& nccl_watch() {
  static NcclWatch* w = new NcclWatch();  // never destroyed: the thread may outlive static destruction's order
  return *w;
}

std::string async_error_of(NcclComm& c) {
  ncclResult_t r = ncclSuccess;
  if (ncclCommGetAsyncError(c.comm, &r) != ncclSuccess) return "ncclCommGetAsyncError failed";
  if (r == ncclSuccess || r == ncclInProgress) return "";
  const char* last = ncclGetLastError(c.comm);
  return fmt::format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

[[noreturn]] void nccl_end_job(const std::string& text) {
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  NcclWatch& w = nccl_watch();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    for (auto& weak : w.comms)
      if (auto c = weak.lock(); c && !c->aborted.exchange(true)) ncclCommAbort(c->comm);
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// Polls every 20 ms: completed operations leave the list; an asynchronous error or an operation older than the
// collective timeout ends the job (nccl_fault.h decides and words it).
void watchdog_loop(int device) {
  cudaSetDevice(device);
  NcclWatch& w = nccl_watch();
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  while (!w.stop.load()) {
    std::vector<std::shared_ptr<NcclPending>> ops;
    {
      std::lock_guard<std::mutex> lock(w.mu);
      auto& v = w.in_flight;
      v.erase(
          std::remove_if(v.begin(), v.end(),
                         [](const std::shared_ptr<NcclPending>& p) { return cudaEventQuery(p->done) == cudaSuccess; }),
          v.end());
      ops = v;
    }
    std::vector<NcclInFlight> seen;
    for (const auto& p : ops)
      seen.push_back({p->site.group, p->site.members, p->site.seq, p->site.op, p->issued_at, async_error_of(*p->comm)});
    const NcclFault f = find_nccl_fault(seen, now_seconds(), collective_timeout());
    if (f.kind != NcclFaultKind::None)
      nccl_end_job(nccl_fault_message(seen[f.index], f, me, collective_timeout_source()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void start_watchdog(int device) {
  NcclWatch& w = nccl_watch();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.started) return;
  w.started = true;
  w.thread = std::thread(watchdog_loop, device);
  std::atexit(nccl_shutdown);
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
  }
  return ncclUint8;
}

// compute → comm: the group's stream waits for what the current stream has written so far.
std::shared_ptr<NcclPending> nccl_launch_begin(NcclComm& c, NcclSite site) {
  auto p = std::make_shared<NcclPending>();
  p->site = std::move(site);
  cudaEvent_t ready = nullptr;
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  MOE_CUDA_CHECK(cudaEventRecord(ready, device::current_stream()));
  const cudaError_t e = cudaStreamWaitEvent(c.stream, ready, 0);
  cudaEventDestroy(ready);  // released once the recorded work completes
  MOE_CUDA_CHECK(e);
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
  return p;
}

// After the NCCL call(s): the event the compute stream will wait on, and the watchdog's entry.
std::shared_ptr<NcclPending> nccl_launch_end(const std::shared_ptr<NcclComm>& c, std::shared_ptr<NcclPending> p) {
  MOE_CUDA_CHECK(cudaEventRecord(p->done, c->stream));
  p->comm = c;
  p->issued_at = now_seconds();
  NcclWatch& w = nccl_watch();
  std::lock_guard<std::mutex> lock(w.mu);
  w.in_flight.push_back(p);
  return p;
}

}  // namespace

std::shared_ptr<NcclComm> nccl_comm_create(MPI_Comm mpi, const std::string& group) {
  int rank = 0, size = 1;
  MOE_MPI(MPI_Comm_rank(mpi, &rank));
  MOE_MPI(MPI_Comm_size(mpi, &size));
  ncclUniqueId id;
  if (rank == 0) MOE_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, group);
  MOE_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi));
  auto c = std::make_shared<NcclComm>();
  c->group = group;
  MOE_CUDA_CHECK(cudaGetDevice(&c->device));
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  MOE_NCCL_CHECK(ncclCommInitRank(&c->comm, size, id, rank), nullptr, group);
  {
    NcclWatch& w = nccl_watch();
    std::lock_guard<std::mutex> lock(w.mu);
    w.comms.push_back(c);
  }
  start_watchdog(c->device);
  return c;
}

std::shared_ptr<NcclPending> nccl_all_reduce(const std::shared_ptr<NcclComm>& cp, void* buf, size_t count, DType dtype,
                                             bool max, NcclSite site) {
  NcclComm& c = *cp;
  auto p = nccl_launch_begin(c, std::move(site));
  MOE_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), max ? ncclMax : ncclSum, c.comm, c.stream), c.comm,
                 c.group);
  return nccl_launch_end(cp, std::move(p));
}

std::shared_ptr<NcclPending> nccl_all_gather(const std::shared_ptr<NcclComm>& cp, const void* in, void* out,
                                             size_t count_per_rank, DType dtype, NcclSite site) {
  NcclComm& c = *cp;
  auto p = nccl_launch_begin(c, std::move(site));
  MOE_NCCL_CHECK(ncclAllGather(in, out, count_per_rank, nccl_type(dtype), c.comm, c.stream), c.comm, c.group);
  return nccl_launch_end(cp, std::move(p));
}

std::shared_ptr<NcclPending> nccl_reduce_scatter(const std::shared_ptr<NcclComm>& cp, const void* in, void* out,
                                                 size_t count_per_rank, DType dtype, bool max, NcclSite site) {
  NcclComm& c = *cp;
  auto p = nccl_launch_begin(c, std::move(site));
  MOE_NCCL_CHECK(
      ncclReduceScatter(in, out, count_per_rank, nccl_type(dtype), max ? ncclMax : ncclSum, c.comm, c.stream), c.comm,
      c.group);
  return nccl_launch_end(cp, std::move(p));
}

std::shared_ptr<NcclPending> nccl_broadcast(const std::shared_ptr<NcclComm>& cp, void* buf, size_t count, DType dtype,
                                            int root, NcclSite site) {
  NcclComm& c = *cp;
  auto p = nccl_launch_begin(c, std::move(site));
  MOE_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, c.comm, c.stream), c.comm, c.group);
  return nccl_launch_end(cp, std::move(p));
}

std::shared_ptr<NcclPending> nccl_send_recv(const std::shared_ptr<NcclComm>& cp,
                                            const std::vector<NcclPeerBuffer>& sends,
                                            const std::vector<NcclPeerBuffer>& recvs, DType dtype, NcclSite site) {
  NcclComm& c = *cp;
  auto p = nccl_launch_begin(c, std::move(site));
  const ncclDataType_t t = nccl_type(dtype);
  MOE_NCCL_CHECK(ncclGroupStart(), c.comm, c.group);
  for (const auto& s : sends)
    if (s.count > 0) MOE_NCCL_CHECK(ncclSend(s.ptr, s.count, t, s.peer, c.comm, c.stream), c.comm, c.group);
  for (const auto& r : recvs)
    if (r.count > 0) MOE_NCCL_CHECK(ncclRecv(r.ptr, r.count, t, r.peer, c.comm, c.stream), c.comm, c.group);
  MOE_NCCL_CHECK(ncclGroupEnd(), c.comm, c.group);
  return nccl_launch_end(cp, std::move(p));
}

void nccl_wait(const NcclPending& p) {
  MOE_CUDA_CHECK(cudaStreamWaitEvent(device::current_stream(), p.done, 0));
}

bool nccl_done(const NcclPending& p) {
  const cudaError_t e = cudaEventQuery(p.done);
  if (e == cudaErrorNotReady) return false;
  MOE_CUDA_CHECK(e);
  return true;
}

void nccl_shutdown() {
  NcclWatch& w = nccl_watch();
  w.stop.store(true);
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    t = std::move(w.thread);
  }
  if (t.joinable()) t.join();
}

}  // namespace moecore::comm
