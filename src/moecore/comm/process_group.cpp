// ProcessGroup over MPI, and the choice of NCCL for GPU tensors (see process_group.h; the NCCL paths are in
// process_group_nccl.cpp).
#include "moecore/comm/process_group.h"

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "moecore/comm/gpu_transport.h"
#include "moecore/comm/mpi_check.h"
#include "moecore/comm/watchdog.h"
#include "moecore/core/error.h"
#include "moecore/core/timer.h"

namespace moecore::comm {

namespace {
std::string mpi_error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(msg, static_cast<size_t>(len));
}
}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  MOE_ASSERT_MSG(false, "MPI {} failed: {}", what, mpi_error_string(rc));
}

void check_mpi_nothrow(int rc, const char* what) noexcept {
  if (rc == MPI_SUCCESS) return;
  std::fprintf(stderr, "moecore: MPI %s failed: %s\n", what, mpi_error_string(rc).c_str());
  std::abort();
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;  // moved, never reduced
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  MOE_ASSERT_MSG(dtype_size(t) != 2, "reductions run in f32/f64 (bf16 and f16 tensors can only be moved)");
  return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
}

int to_int(int64_t n, const char* what) {
  MOE_ASSERT_MSG(n >= 0 && n <= INT_MAX, "{}: {} elements exceed MPI's int counts", what, n);
  return static_cast<int>(n);
}

int64_t row_elems(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / std::max<int64_t>(1, t.dim(0));
}
}  // namespace

std::map<std::string, CommCounter>& comm_counters() {
  static std::map<std::string, CommCounter> m;
  return m;
}

void ProcessGroup::count(Work& w, const char* op, double payload, double received, int64_t peer) const {
  w.what_ = op;
  if (size_ == 1) return;
  w.group_ = name_;
  if (peer >= 0)
    w.members_ =
        std::make_shared<const std::vector<int>>(std::vector<int>{(*comm_->world_ranks)[static_cast<size_t>(peer)]});
  else
    w.members_ = comm_->world_ranks;
  w.seq_ = peer >= 0 ? 0 : ++comm_->seq;
  w.counter_ = name_ + ":" + op;
  CommCounter& c = comm_counters()[w.counter_];
  c.calls++;
  c.payload_bytes += payload;
  c.received_bytes += received;
}

Work::Work(Work&& o) noexcept
    : req_(o.req_),
      counts_a_(std::move(o.counts_a_)),
      displs_a_(std::move(o.displs_a_)),
      counts_b_(std::move(o.counts_b_)),
      displs_b_(std::move(o.displs_b_)),
      what_(o.what_),
      counter_(std::move(o.counter_)),
      members_(std::move(o.members_)),
      group_(std::move(o.group_)),
      seq_(o.seq_),
      staged_(std::move(o.staged_)),
      unstage_to_(std::move(o.unstage_to_)),
      nccl_(std::move(o.nccl_)),
      keep_(std::move(o.keep_)) {
  o.req_ = MPI_REQUEST_NULL;
  o.nccl_ = nullptr;
  o.staged_ = Tensor();
  o.unstage_to_ = Tensor();
}

Work& Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    if (pending()) MOE_MPI_NOTHROW(finish());  // finish what this handle owned before taking another
    unstage();
    req_ = o.req_;
    o.req_ = MPI_REQUEST_NULL;
    counts_a_ = std::move(o.counts_a_);
    displs_a_ = std::move(o.displs_a_);
    counts_b_ = std::move(o.counts_b_);
    displs_b_ = std::move(o.displs_b_);
    what_ = o.what_;
    counter_ = std::move(o.counter_);
    members_ = std::move(o.members_);
    group_ = std::move(o.group_);
    seq_ = o.seq_;
    staged_ = std::move(o.staged_);
    unstage_to_ = std::move(o.unstage_to_);
    nccl_ = std::move(o.nccl_);
    o.nccl_ = nullptr;
    keep_ = std::move(o.keep_);
    o.staged_ = Tensor();
    o.unstage_to_ = Tensor();
  }
  return *this;
}

Work::~Work() {
  try {
    if (pending()) MOE_MPI_NOTHROW(finish());
    unstage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moecore: a pending operation could not be finished: %s\n", e.what());
  }
}

void Work::unstage() {
  if (unstage_to_.defined()) unstage_to_.copy_from(staged_);
  unstage_to_ = Tensor();
  staged_ = Tensor();
}

int Work::finish() {
  if (nccl_) {  // the current stream waits for the operation; its buffers may be reused by that stream after it
    nccl_wait(*nccl_);
    nccl_ = nullptr;
    keep_.clear();
    return MPI_SUCCESS;
  }
  const WaitSite site{&group_, members_.get(), seq_, what_};
  return wait_with_watchdog(&req_, site);
}

void Work::wait() {
  if (!pending()) return;
  const Stopwatch timer;
  MOE_MPI(finish());
  if (!counter_.empty()) comm_counters()[counter_].blocked_seconds += timer.seconds();
  unstage();
}

bool Work::test() {
  if (!pending()) return true;
  if (nccl_) {
    if (!nccl_done(*nccl_)) return false;
    finish();
    unstage();
    return true;
  }
  int flag = 0;
  MOE_MPI(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
  if (flag != 0) unstage();
  return flag != 0;
}

ProcessGroup::Comm::~Comm() {
  int finalized = 0;
  MOE_MPI_NOTHROW(MPI_Finalized(&finalized));
  if (owned && !finalized && c != MPI_COMM_NULL) MOE_MPI_NOTHROW(MPI_Comm_free(&c));
}

void ProcessGroup::init(int* argc, char*** argv) {
  int inited = 0;
  MOE_MPI(MPI_Initialized(&inited));
  if (inited) return;
  int provided = 0;
  MOE_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MOE_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  init_watchdog();
}

void ProcessGroup::finalize() {
  int inited = 0, finalized = 0;
  MOE_MPI(MPI_Initialized(&inited));
  MOE_MPI(MPI_Finalized(&finalized));
  if (inited && !finalized) {
    nccl_shutdown();
    free_watchdog();
    MOE_MPI(MPI_Finalize());
  }
}

void ProcessGroup::abort_job_if_shared(int rc) {
  int inited = 0, finalized = 0, size = 1;
  MOE_MPI_NOTHROW(MPI_Initialized(&inited));
  MOE_MPI_NOTHROW(MPI_Finalized(&finalized));
  if (!inited || finalized) return;
  MOE_MPI_NOTHROW(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size > 1) MOE_MPI_NOTHROW(MPI_Abort(MPI_COMM_WORLD, rc));
}

ProcessGroup::ProcessGroup(std::shared_ptr<Comm> c) : comm_(std::move(c)) {
  int r = 0, s = 1;
  MOE_MPI(MPI_Comm_rank(comm_->c, &r));
  MOE_MPI(MPI_Comm_size(comm_->c, &s));
  rank_ = r;
  size_ = s;
  if (!comm_->world_ranks) {  // the members' world ranks, for the watchdog's messages
    std::vector<int> mine(static_cast<size_t>(s)), world(static_cast<size_t>(s));
    for (int i = 0; i < s; i++) mine[static_cast<size_t>(i)] = i;
    MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    MOE_MPI(MPI_Comm_group(comm_->c, &g));
    MOE_MPI(MPI_Comm_group(MPI_COMM_WORLD, &wg));
    MOE_MPI(MPI_Group_translate_ranks(g, s, mine.data(), wg, world.data()));
    MOE_MPI(MPI_Group_free(&g));
    MOE_MPI(MPI_Group_free(&wg));
    comm_->world_ranks = std::make_shared<const std::vector<int>>(std::move(world));
  }
}

ProcessGroup ProcessGroup::world() {
  auto c = std::make_shared<Comm>();
  c->c = MPI_COMM_WORLD;
  ProcessGroup w(c);
  w.set_name("world");
  return w;
}

ProcessGroup ProcessGroup::split(const RankGroups& groups) const {
  int color = -1, key = 0;
  for (size_t g = 0; g < groups.size(); g++)
    for (size_t i = 0; i < groups[g].size(); i++)
      if (groups[g][i] == rank_) {
        color = static_cast<int>(g);
        key = static_cast<int>(i);
      }
  MOE_ASSERT_MSG(color >= 0, "rank {} is in none of the groups", rank_);
  auto c = std::make_shared<Comm>();
  MOE_MPI(MPI_Comm_split(comm_->c, color, key, &c->c));
  c->owned = true;
  MOE_MPI(MPI_Comm_set_errhandler(c->c, MPI_ERRORS_RETURN));
  ProcessGroup g(c);
  // Made with the group (every member is here), so a point-to-point call never has to make it.
  if (gpu_transport() == GpuTransport::Nccl) c->nccl = shared_nccl_comm(c->c, *c->world_ranks, "group");
  return g;
}

namespace {
// One NCCL communicator per set of members, kept for the process: groups with the same ranks (dp and tp-dp without
// TP, the trainers of the tests) share it, which saves its initialization and its buffers on the GPU. Every member
// makes or finds it in the same collective call, so all members agree. Never destroyed (process exit frees it).
std::map<std::vector<int>, std::shared_ptr<NcclComm>>& nccl_comms_by_members() {
  static auto* m = new std::map<std::vector<int>, std::shared_ptr<NcclComm>>();
  return *m;
}
}  // namespace

std::shared_ptr<NcclComm> ProcessGroup::shared_nccl_comm(MPI_Comm c, const std::vector<int>& members,
                                                         const std::string& name) {
  auto& m = nccl_comms_by_members();
  auto& slot = m[members];
  if (!slot) slot = nccl_comm_create(c, name);
  return slot;
}

const std::shared_ptr<NcclComm>* ProcessGroup::nccl_for(const Tensor& a, const Tensor& b, bool collective) const {
  const bool gpu = (a.defined() && a.device().is_cuda()) || (b.defined() && b.device().is_cuda());
  if (!gpu || gpu_transport() != GpuTransport::Nccl) return nullptr;
  if (!comm_->nccl) {
    MOE_ASSERT_MSG(collective || size_ <= 2,
                   "a point-to-point call on the {} group ({} ranks) before its NCCL communicator exists: make it "
                   "with a collective first",
                   name_, size_);
    comm_->nccl = shared_nccl_comm(comm_->c, *comm_->world_ranks, name_);
  }
  return &comm_->nccl;
}

NcclSite ProcessGroup::site(const Work& w) const {
  NcclSite s;
  s.group = name_;
  s.op = w.what_;
  s.seq = w.seq_;
  const int me = (*comm_->world_ranks)[static_cast<size_t>(rank_)];
  if (w.members_) s.members = *w.members_;
  if (w.members_ && w.members_->size() == 1 && s.members[0] != me) s.members.insert(s.members.begin(), me);
  if (s.members.empty()) s.members = {me};
  return s;
}

namespace {
// GPU tensors travel through host copies (host-staged MPI; NCCL is a later backend behind this same interface): the
// collective runs on the copies synchronously, and the result is copied back; a point-to-point message may stay
// asynchronous, its host copy held by the Work (and a receive copied to the GPU when the Work completes).
bool on_gpu(const Tensor& t) {
  return t.defined() && t.device().is_cuda();
}
Tensor host_copy(const Tensor& t) {
  return t.to(Device::cpu());
}
Tensor host_like(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), Device::cpu());
}
}  // namespace

Work ProcessGroup::all_reduce(Tensor& t, ReduceOp op, bool async) const {
  if (nccl_for(t, Tensor(), true)) return nccl_all_reduce(t, op, async);
  if (on_gpu(t)) {
    Tensor h = host_copy(t);
    Work w = all_reduce(h, op, false);
    t.copy_from(h);
    return w;
  }
  Work w;
  w.what_ = "all_reduce";
  MOE_MPI(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), to_int(t.numel(), "all_reduce"), mpi_type(t.dtype()),
                         mpi_op(op, t.dtype()), comm_->c, &w.req_));
  {
    const double n = static_cast<double>(t.nbytes()), P = static_cast<double>(size_);
    count(w, "all_reduce", n, 2.0 * (P - 1) / P * n);
  }
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::all_gather(const Tensor& in, Tensor& out, bool async) const {
  MOE_ASSERT_MSG(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(), "all_gather: in {} out {} size {}",
                 in.shape().str(), out.shape().str(), size_);
  if (nccl_for(in, out, true)) return nccl_all_gather(in, out, async);
  if (on_gpu(in) || on_gpu(out)) {
    Tensor h = host_like(out);
    Work w = all_gather(host_copy(in), h, false);
    out.copy_from(h);
    return w;
  }
  Work w;
  const int n = to_int(in.numel(), "all_gather");
  MOE_MPI(MPI_Iallgather(in.raw(), n, mpi_type(in.dtype()), out.raw(), n, mpi_type(out.dtype()), comm_->c, &w.req_));
  count(w, "all_gather", static_cast<double>(in.nbytes()), static_cast<double>(out.nbytes() - in.nbytes()));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::all_gather_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows, bool async) const {
  if (nccl_for(in, out, true)) return nccl_all_gather_v(in, out, rows, async);
  if (on_gpu(in) || on_gpu(out)) {
    Tensor h = host_like(out);
    Work w = all_gather_v(host_copy(in), h, rows, false);
    out.copy_from(h);
    return w;
  }
  MOE_ASSERT(static_cast<int64_t>(rows.size()) == size_ && in.dtype() == out.dtype());
  MOE_ASSERT_MSG(in.numel() == 0 || in.dim(0) == rows[static_cast<size_t>(rank_)], "all_gather_v: {} rows, expected {}",
                 in.ndim() ? in.dim(0) : 0, rows[static_cast<size_t>(rank_)]);
  const int64_t re = out.numel() == 0 ? row_elems(in) : row_elems(out);
  Work w;
  int64_t off = 0;
  for (int64_t r : rows) {
    w.counts_a_.push_back(to_int(r * re, "all_gather_v"));
    w.displs_a_.push_back(to_int(off, "all_gather_v"));
    off += r * re;
  }
  MOE_ASSERT_MSG(off == out.numel(), "all_gather_v: output holds {} elements, the counts give {}", out.numel(), off);
  MOE_MPI(MPI_Iallgatherv(in.raw(), to_int(in.numel(), "all_gather_v"), mpi_type(in.dtype()), out.raw(),
                          w.counts_a_.data(), w.displs_a_.data(), mpi_type(out.dtype()), comm_->c, &w.req_));
  count(w, "all_gather_v", static_cast<double>(in.nbytes()), static_cast<double>(out.nbytes() - in.nbytes()));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) const {
  MOE_ASSERT_MSG(in.numel() == out.numel() * size_ && in.dtype() == out.dtype(), "reduce_scatter: in {} out {}",
                 in.shape().str(), out.shape().str());
  if (nccl_for(in, out, true)) return nccl_reduce_scatter(in, out, op, async);
  if (on_gpu(in) || on_gpu(out)) {
    Tensor h = host_like(out);
    Work w = reduce_scatter(host_copy(in), h, op, false);
    out.copy_from(h);
    return w;
  }
  Work w;
  MOE_MPI(MPI_Ireduce_scatter_block(in.raw(), out.raw(), to_int(out.numel(), "reduce_scatter"), mpi_type(in.dtype()),
                                    mpi_op(op, in.dtype()), comm_->c, &w.req_));
  count(w, "reduce_scatter", static_cast<double>(in.nbytes()), static_cast<double>(in.nbytes() - out.nbytes()));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::reduce_scatter_in_place(Tensor& buf, ReduceOp op, bool async) const {
  MOE_ASSERT_MSG(buf.numel() % size_ == 0, "reduce_scatter_in_place: {} elements over {} ranks", buf.numel(), size_);
  if (nccl_for(buf, Tensor(), true)) return nccl_reduce_scatter_in_place(buf, op, async);
  const int64_t n = buf.numel() / size_;
  Tensor flat = buf.reshape({buf.numel()});
  if (on_gpu(buf)) {
    Tensor h = host_copy(flat);
    Work w = reduce_scatter_in_place(h, op, false);
    flat.slice(rank_ * n, n).copy_from(h.slice(rank_ * n, n));
    return w;
  }
  Work w;
  // MPI's in-place form leaves the result at the front of the buffer: the Work moves it to this rank's region on
  // completion (regions do not overlap for rank > 0; rank 0's region is the front).
  MOE_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, flat.raw(), to_int(n, "reduce_scatter_in_place"),
                                    mpi_type(buf.dtype()), mpi_op(op, buf.dtype()), comm_->c, &w.req_));
  if (rank_ > 0) {
    w.staged_ = flat.slice(0, n);
    w.unstage_to_ = flat.slice(rank_ * n, n);
  }
  count(w, "reduce_scatter", static_cast<double>(buf.nbytes()),
        static_cast<double>(buf.nbytes()) * static_cast<double>(size_ - 1) / static_cast<double>(size_));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::all_gather_in_place(Tensor& buf, bool async) const {
  MOE_ASSERT_MSG(buf.numel() % size_ == 0, "all_gather_in_place: {} elements over {} ranks", buf.numel(), size_);
  if (nccl_for(buf, Tensor(), true)) return nccl_all_gather_in_place(buf, async);
  const int64_t n = buf.numel() / size_;
  Tensor flat = buf.reshape({buf.numel()});
  if (on_gpu(buf)) {
    Tensor h = host_copy(flat);
    Work w = all_gather_in_place(h, false);
    flat.copy_from(h);
    return w;
  }
  Work w;
  MOE_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, flat.raw(), to_int(n, "all_gather_in_place"),
                         mpi_type(buf.dtype()), comm_->c, &w.req_));
  count(w, "all_gather", static_cast<double>(n) * static_cast<double>(dtype_size(buf.dtype())),
        static_cast<double>(buf.nbytes()) * static_cast<double>(size_ - 1) / static_cast<double>(size_));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::reduce_scatter_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows, ReduceOp op,
                                    bool async) const {
  MOE_ASSERT(static_cast<int64_t>(rows.size()) == size_ && in.dtype() == out.dtype());
  if (nccl_for(in, out, true)) return nccl_reduce_scatter_v(in, out, rows, op, async);
  if (on_gpu(in) || on_gpu(out)) {
    Tensor h = host_like(out);
    Work w = reduce_scatter_v(host_copy(in), h, rows, op, false);
    out.copy_from(h);
    return w;
  }
  const int64_t re = in.numel() == 0 ? row_elems(out) : row_elems(in);
  Work w;
  int64_t total = 0;
  for (int64_t r : rows) {
    w.counts_a_.push_back(to_int(r * re, "reduce_scatter_v"));
    total += r * re;
  }
  MOE_ASSERT_MSG(total == in.numel() && out.numel() == rows[static_cast<size_t>(rank_)] * re,
                 "reduce_scatter_v: in {} out {}, the counts give {} and {}", in.shape().str(), out.shape().str(),
                 total, rows[static_cast<size_t>(rank_)] * re);
  MOE_MPI(MPI_Ireduce_scatter(in.raw(), out.raw(), w.counts_a_.data(), mpi_type(in.dtype()), mpi_op(op, in.dtype()),
                              comm_->c, &w.req_));
  count(w, "reduce_scatter_v", static_cast<double>(in.nbytes()), static_cast<double>(in.nbytes() - out.nbytes()));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                                const std::vector<int64_t>& recv_rows, bool async) const {
  MOE_ASSERT(static_cast<int64_t>(send_rows.size()) == size_ && static_cast<int64_t>(recv_rows.size()) == size_);
  MOE_ASSERT(in.dtype() == out.dtype());
  if (nccl_for(in, out, true)) return nccl_all_to_all_v(in, send_rows, out, recv_rows, async);
  if (on_gpu(in) || on_gpu(out)) {
    Tensor h = host_like(out);
    Work w = all_to_all_v(host_copy(in), send_rows, h, recv_rows, false);
    out.copy_from(h);
    return w;
  }
  const int64_t re = in.numel() > 0 ? row_elems(in) : row_elems(out);
  Work w;
  int64_t so = 0, ro = 0;
  for (int64_t r = 0; r < size_; r++) {
    w.counts_a_.push_back(to_int(send_rows[static_cast<size_t>(r)] * re, "all_to_all_v"));
    w.displs_a_.push_back(to_int(so, "all_to_all_v"));
    so += send_rows[static_cast<size_t>(r)] * re;
    w.counts_b_.push_back(to_int(recv_rows[static_cast<size_t>(r)] * re, "all_to_all_v"));
    w.displs_b_.push_back(to_int(ro, "all_to_all_v"));
    ro += recv_rows[static_cast<size_t>(r)] * re;
  }
  MOE_ASSERT_MSG(so == in.numel() && ro == out.numel(), "all_to_all_v: send {} of {}, receive {} into {}", so,
                 in.numel(), ro, out.numel());
  MOE_MPI(MPI_Ialltoallv(in.raw(), w.counts_a_.data(), w.displs_a_.data(), mpi_type(in.dtype()), out.raw(),
                         w.counts_b_.data(), w.displs_b_.data(), mpi_type(out.dtype()), comm_->c, &w.req_));
  {
    const double es = static_cast<double>(dtype_size(in.dtype()) * re);
    const double self = static_cast<double>(recv_rows[static_cast<size_t>(rank_)]) * es;
    count(w, "all_to_all_v", static_cast<double>(in.nbytes()), static_cast<double>(out.nbytes()) - self);
  }
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::broadcast(Tensor& t, int64_t root, bool async) const {
  if (nccl_for(t, Tensor(), true)) return nccl_broadcast(t, root, async);
  if (on_gpu(t)) {
    Tensor h = host_copy(t);
    Work w = broadcast(h, root, false);
    t.copy_from(h);
    return w;
  }
  Work w;
  MOE_MPI(MPI_Ibcast(t.raw(), to_int(t.numel(), "broadcast"), mpi_type(t.dtype()), static_cast<int>(root), comm_->c,
                     &w.req_));
  count(w, "broadcast", static_cast<double>(t.nbytes()), rank_ == root ? 0.0 : static_cast<double>(t.nbytes()));
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::send(const Tensor& t, int64_t dst, int tag, bool async) const {
  if (nccl_for(t, Tensor(), false)) return nccl_send_recv(&t, dst, nullptr, -1, async);
  if (on_gpu(t)) {  // the host copy is sent, and held by the Work until the send completes
    Tensor h = host_copy(t);
    Work w = send(h, dst, tag, async);
    w.staged_ = h;
    return w;
  }
  Work w;
  MOE_MPI(MPI_Isend(t.raw(), to_int(t.numel(), "send"), mpi_type(t.dtype()), static_cast<int>(dst), tag, comm_->c,
                    &w.req_));
  count(w, "send", static_cast<double>(t.nbytes()), 0.0, dst);
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::recv(Tensor& t, int64_t src, int tag, bool async) const {
  if (nccl_for(t, Tensor(), false)) return nccl_send_recv(nullptr, -1, &t, src, async);
  if (on_gpu(t)) {  // received into a host buffer the Work holds, copied into t when it completes (wait or test)
    Tensor h = host_like(t);
    Work w = recv(h, src, tag, async);
    if (async) {
      w.staged_ = h;
      w.unstage_to_ = t;
    } else {
      t.copy_from(h);
    }
    return w;
  }
  Work w;
  MOE_MPI(MPI_Irecv(t.raw(), to_int(t.numel(), "recv"), mpi_type(t.dtype()), static_cast<int>(src), tag, comm_->c,
                    &w.req_));
  count(w, "recv", 0.0, static_cast<double>(t.nbytes()), src);
  if (!async) w.wait();
  return w;
}

std::pair<Work, Work> ProcessGroup::send_recv(const Tensor& send_t, int64_t dst, Tensor& recv_t, int64_t src, int tag,
                                              bool async) const {
  if (nccl_for(send_t, recv_t, false)) {
    Work s = nccl_send_recv(&send_t, dst, &recv_t, src, async);
    Work r;  // the same grouped operation: waiting on either orders the stream after both
    r.what_ = "recv";
    r.nccl_ = s.nccl_;
    return {std::move(s), std::move(r)};
  }
  Work s = send(send_t, dst, tag, true);
  Work r = recv(recv_t, src, tag, true);
  if (!async) {
    s.wait();
    r.wait();
  }
  return {std::move(s), std::move(r)};
}

void ProcessGroup::barrier() const {
  Work w;
  MOE_MPI(MPI_Ibarrier(comm_->c, &w.req_));
  w.what_ = "barrier";  // named for the watchdog, not counted as traffic
  w.group_ = name_;
  w.members_ = comm_->world_ranks;
  w.seq_ = ++comm_->seq;
  w.wait();
}

}  // namespace moecore::comm
