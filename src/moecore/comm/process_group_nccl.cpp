// ProcessGroup's operations on GPU tensors over NCCL (see process_group.h): each launches on the group's NCCL
// stream after the current stream's work (comm/nccl_comm.h) and returns a Work holding the tensors; no host copy.
// Variable-size operations: all-gather-v and all-to-all-v are grouped sends and receives of exactly the rows each
// rank has (NCCL's own recipe for v-collectives; the counts are on the host already), so nothing is padded or
// copied. Reduce-scatter-v pads: each rank's block is copied into a buffer of the largest block per rank and NCCL's
// reduce-scatter reduces it, then this rank's rows are copied out when the Work is waited on (NCCL has no
// reduce-scatter-v, and grouped sends would need a reduction kernel of our own; the pad costs the spread of the
// blocks, which the callers keep small: sequence shards differ by at most a row).
#include <algorithm>

#include "moecore/comm/process_group.h"
#include "moecore/core/error.h"

namespace moecore::comm {

namespace {
int64_t nccl_row_elems(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / std::max<int64_t>(1, t.dim(0));
}
// Element `elems` of t (null for an empty tensor, which may have no storage; NCCL skips zero counts).
char* nccl_ptr_at(const Tensor& t, int64_t elems) {
  if (!t.defined() || t.numel() == 0) return nullptr;
  return static_cast<char*>(t.raw()) + elems * static_cast<int64_t>(dtype_size(t.dtype()));
}
size_t nccl_count(int64_t n) {
  MOE_ASSERT(n >= 0);
  return static_cast<size_t>(n);
}
void nccl_check_reducible(DType t) {
  MOE_ASSERT_MSG(t != DType::BF16, "reductions run in f32/f64 (bf16 tensors can only be moved)");
}
}  // namespace

Work ProcessGroup::nccl_all_reduce(Tensor& t, ReduceOp op, bool async) const {
  nccl_check_reducible(t.dtype());
  Work w;
  const double n = static_cast<double>(t.nbytes()), P = static_cast<double>(size_);
  count(w, "all_reduce", n, 2.0 * (P - 1) / P * n);
  w.nccl_ = comm::nccl_all_reduce(comm_->nccl, nccl_ptr_at(t, 0), nccl_count(t.numel()), t.dtype(), op == ReduceOp::Max,
                                  site(w));
  w.keep_ = {t};
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::nccl_all_gather(const Tensor& in, Tensor& out, bool async) const {
  Work w;
  count(w, "all_gather", static_cast<double>(in.nbytes()), static_cast<double>(out.nbytes() - in.nbytes()));
  w.nccl_ = comm::nccl_all_gather(comm_->nccl, nccl_ptr_at(in, 0), nccl_ptr_at(out, 0), nccl_count(in.numel()),
                                  in.dtype(), site(w));
  w.keep_ = {in, out};
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::nccl_all_gather_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows,
                                     bool async) const {
  MOE_ASSERT(static_cast<int64_t>(rows.size()) == size_ && in.dtype() == out.dtype());
  MOE_ASSERT_MSG(in.numel() == 0 || in.dim(0) == rows[static_cast<size_t>(rank_)], "all_gather_v: {} rows, expected {}",
                 in.ndim() ? in.dim(0) : 0, rows[static_cast<size_t>(rank_)]);
  const int64_t re = out.numel() == 0 ? nccl_row_elems(in) : nccl_row_elems(out);
  std::vector<NcclPeerBuffer> sends, recvs;
  int64_t off = 0;
  for (int64_t r = 0; r < size_; r++) {
    const int64_t n = rows[static_cast<size_t>(r)] * re;
    sends.push_back({static_cast<int>(r), nccl_ptr_at(in, 0), nccl_count(in.numel())});
    recvs.push_back({static_cast<int>(r), nccl_ptr_at(out, off), nccl_count(n)});
    off += n;
  }
  MOE_ASSERT_MSG(off == out.numel(), "all_gather_v: output holds {} elements, the counts give {}", out.numel(), off);
  Work w;
  count(w, "all_gather_v", static_cast<double>(in.nbytes()), static_cast<double>(out.nbytes() - in.nbytes()));
  w.nccl_ = comm::nccl_send_recv(comm_->nccl, sends, recvs, in.dtype(), site(w));
  w.keep_ = {in, out};
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::nccl_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) const {
  nccl_check_reducible(in.dtype());
  Work w;
  count(w, "reduce_scatter", static_cast<double>(in.nbytes()), static_cast<double>(in.nbytes() - out.nbytes()));
  w.nccl_ = comm::nccl_reduce_scatter(comm_->nccl, nccl_ptr_at(in, 0), nccl_ptr_at(out, 0), nccl_count(out.numel()),
                                      in.dtype(), op == ReduceOp::Max, site(w));
  w.keep_ = {in, out};
  if (!async) w.wait();
  return w;
}

// NCCL's in-place reduce-scatter: the receive buffer is this rank's region of the send buffer.
Work ProcessGroup::nccl_reduce_scatter_in_place(Tensor& buf, ReduceOp op, bool async) const {
  nccl_check_reducible(buf.dtype());
  MOE_ASSERT_MSG(buf.numel() % size_ == 0, "reduce_scatter_in_place: {} elements over {} ranks", buf.numel(), size_);
  const int64_t n = buf.numel() / size_;
  Work w;
  count(w, "reduce_scatter", static_cast<double>(buf.nbytes()),
        static_cast<double>(buf.nbytes()) * static_cast<double>(size_ - 1) / static_cast<double>(size_));
  w.nccl_ = comm::nccl_reduce_scatter(comm_->nccl, nccl_ptr_at(buf, 0), nccl_ptr_at(buf, rank_ * n), nccl_count(n),
                                      buf.dtype(), op == ReduceOp::Max, site(w));
  w.keep_ = {buf};
  if (!async) w.wait();
  return w;
}

// NCCL's in-place all-gather: the send buffer is this rank's region of the receive buffer.
Work ProcessGroup::nccl_all_gather_in_place(Tensor& buf, bool async) const {
  MOE_ASSERT_MSG(buf.numel() % size_ == 0, "all_gather_in_place: {} elements over {} ranks", buf.numel(), size_);
  const int64_t n = buf.numel() / size_;
  Work w;
  count(w, "all_gather", static_cast<double>(n) * static_cast<double>(dtype_size(buf.dtype())),
        static_cast<double>(buf.nbytes()) * static_cast<double>(size_ - 1) / static_cast<double>(size_));
  w.nccl_ = comm::nccl_all_gather(comm_->nccl, nccl_ptr_at(buf, rank_ * n), nccl_ptr_at(buf, 0), nccl_count(n),
                                  buf.dtype(), site(w));
  w.keep_ = {buf};
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::nccl_reduce_scatter_v(const Tensor& in, Tensor& out, const std::vector<int64_t>& rows, ReduceOp op,
                                         bool async) const {
  nccl_check_reducible(in.dtype());
  MOE_ASSERT(static_cast<int64_t>(rows.size()) == size_ && in.dtype() == out.dtype());
  const int64_t re = in.numel() == 0 ? nccl_row_elems(out) : nccl_row_elems(in);
  const int64_t most = *std::max_element(rows.begin(), rows.end()) * re;
  int64_t total = 0;
  for (int64_t r : rows) total += r * re;
  MOE_ASSERT_MSG(total == in.numel() && out.numel() == rows[static_cast<size_t>(rank_)] * re,
                 "reduce_scatter_v: in {} out {}, the counts give {} and {}", in.shape().str(), out.shape().str(),
                 total, rows[static_cast<size_t>(rank_)] * re);
  // Padded to the largest block: device copies on the current stream, before the launch orders NCCL after them.
  Tensor padded_in = Tensor::empty({size_ * most}, in.dtype(), in.device());
  Tensor padded_out = Tensor::empty({most}, in.dtype(), in.device());
  const Tensor flat_in = in.reshape({in.numel()});
  int64_t off = 0;
  for (int64_t r = 0; r < size_; r++) {
    const int64_t n = rows[static_cast<size_t>(r)] * re;
    if (n > 0) padded_in.slice(r * most, n).copy_from(flat_in.slice(off, n));
    off += n;
  }
  Work w;
  count(w, "reduce_scatter_v", static_cast<double>(in.nbytes()), static_cast<double>(in.nbytes() - out.nbytes()));
  w.nccl_ = comm::nccl_reduce_scatter(comm_->nccl, nccl_ptr_at(padded_in, 0), nccl_ptr_at(padded_out, 0),
                                      nccl_count(most), in.dtype(), op == ReduceOp::Max, site(w));
  w.keep_ = {in, out, padded_in, padded_out};
  // This rank's rows leave the padded block once the stream has waited (Work::unstage).
  if (out.numel() > 0) {
    w.staged_ = padded_out.slice(0, out.numel());
    w.unstage_to_ = out.reshape({out.numel()});
  }
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::nccl_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                                     const std::vector<int64_t>& recv_rows, bool async) const {
  MOE_ASSERT(static_cast<int64_t>(send_rows.size()) == size_ && static_cast<int64_t>(recv_rows.size()) == size_);
  MOE_ASSERT(in.dtype() == out.dtype());
  const int64_t re = in.numel() > 0 ? nccl_row_elems(in) : nccl_row_elems(out);
  std::vector<NcclPeerBuffer> sends, recvs;
  int64_t so = 0, ro = 0;
  for (int64_t r = 0; r < size_; r++) {
    const int64_t ns = send_rows[static_cast<size_t>(r)] * re, nr = recv_rows[static_cast<size_t>(r)] * re;
    sends.push_back({static_cast<int>(r), nccl_ptr_at(in, so), nccl_count(ns)});
    recvs.push_back({static_cast<int>(r), nccl_ptr_at(out, ro), nccl_count(nr)});
    so += ns;
    ro += nr;
  }
  MOE_ASSERT_MSG(so == in.numel() && ro == out.numel(), "all_to_all_v: send {} of {}, receive {} into {}", so,
                 in.numel(), ro, out.numel());
  Work w;
  const double self =
      static_cast<double>(recv_rows[static_cast<size_t>(rank_)] * re) * static_cast<double>(dtype_size(in.dtype()));
  count(w, "all_to_all_v", static_cast<double>(in.nbytes()), static_cast<double>(out.nbytes()) - self);
  w.nccl_ = comm::nccl_send_recv(comm_->nccl, sends, recvs, in.dtype(), site(w));
  w.keep_ = {in, out};
  if (!async) w.wait();
  return w;
}

Work ProcessGroup::nccl_broadcast(Tensor& t, int64_t root, bool async) const {
  Work w;
  count(w, "broadcast", static_cast<double>(t.nbytes()), rank_ == root ? 0.0 : static_cast<double>(t.nbytes()));
  w.nccl_ = comm::nccl_broadcast(comm_->nccl, nccl_ptr_at(t, 0), nccl_count(t.numel()), t.dtype(),
                                 static_cast<int>(root), site(w));
  w.keep_ = {t};
  if (!async) w.wait();
  return w;
}

// One send, one receive, or both as one grouped exchange (send_recv). The Work counts as the send when there is one.
Work ProcessGroup::nccl_send_recv(const Tensor* send_t, int64_t dst, Tensor* recv_t, int64_t src, bool async) const {
  std::vector<NcclPeerBuffer> sends, recvs;
  Work w;
  if (send_t) {
    MOE_ASSERT(send_t->device().is_cuda());
    sends.push_back({static_cast<int>(dst), nccl_ptr_at(*send_t, 0), nccl_count(send_t->numel())});
    count(w, "send", static_cast<double>(send_t->nbytes()), 0.0, dst);
    w.keep_.push_back(*send_t);
  }
  if (recv_t) {
    MOE_ASSERT(recv_t->device().is_cuda());
    recvs.push_back({static_cast<int>(src), nccl_ptr_at(*recv_t, 0), nccl_count(recv_t->numel())});
    if (send_t) {
      CommCounter& c = comm_counters()[name_ + ":recv"];  // the exchange's receive, counted as a receive
      c.calls++;
      c.received_bytes += static_cast<double>(recv_t->nbytes());
    } else {
      count(w, "recv", 0.0, static_cast<double>(recv_t->nbytes()), src);
    }
    w.keep_.push_back(*recv_t);
  }
  const DType dtype = send_t ? send_t->dtype() : recv_t->dtype();
  MOE_ASSERT(!send_t || !recv_t || send_t->dtype() == recv_t->dtype());
  w.nccl_ = comm::nccl_send_recv(comm_->nccl, sends, recvs, dtype, site(w));
  if (!async) w.wait();
  return w;
}

}  // namespace moecore::comm
