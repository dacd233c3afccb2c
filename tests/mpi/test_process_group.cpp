// ProcessGroup collectives under mpirun (4 ranks): exact results for every operation, blocking and non-blocking,
// on the world and on groups split from ParallelState.
#include <gtest/gtest.h>

#include <cstdio>

#include "moecore/comm/mpi_check.h"
#include "moecore/comm/process_group.h"

namespace moecore {
namespace {

using comm::ProcessGroup;

Tensor filled(const Shape& s, DType dt, double base, double step) {
  Tensor t = Tensor::empty(s, dt);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, base + step * static_cast<double>(i));
  return t;
}

TEST(ProcessGroup, AllReduceSumAndMaxBlockingAndAsync) {
  const ProcessGroup w = ProcessGroup::world();
  ASSERT_GE(w.size(), 2);
  const double n = static_cast<double>(w.size()), r = static_cast<double>(w.rank());
  Tensor t = filled({3, 5}, DType::F32, r, 1.0);
  w.all_reduce(t);
  for (int64_t i = 0; i < 15; i++) EXPECT_EQ(t.item(i), n * (n - 1) / 2 + n * static_cast<double>(i));
  Tensor m = filled({4}, DType::F64, r * 10, 0.5);
  comm::Work work = w.all_reduce(m, comm::ReduceOp::Max, /*async=*/true);
  double overlap = 0;  // computation while the reduction is in flight
  for (int i = 0; i < 1000; i++) overlap += i;
  work.wait();
  EXPECT_EQ(overlap, 499500.0);
  EXPECT_EQ(m.item(3), (n - 1) * 10 + 1.5);
}

// A Work moved into a longer-lived slot keeps the one live request (the trainer's gradient buckets do this).
TEST(ProcessGroup, WorkHandlesMoveWithoutDoubleWait) {
  const ProcessGroup w = ProcessGroup::world();
  std::vector<comm::Work> slots(3);
  std::vector<Tensor> ts;
  for (int i = 0; i < 6; i++) ts.push_back(filled({64}, DType::F32, 1.0, 0.0));
  // Round two moves new requests into slots whose round-one requests are still pending: the assignment must
  // finish the old request, and the new one must stay live in the slot.
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < 3; i++)
      slots[static_cast<size_t>(i)] = w.all_reduce(ts[static_cast<size_t>(round * 3 + i)], comm::ReduceOp::Sum, true);
  for (auto& s : slots) s.wait();
  comm::Work moved = std::move(slots[0]);
  EXPECT_FALSE(slots[0].pending());
  const double n = static_cast<double>(w.size());
  for (const auto& t : ts) EXPECT_EQ(t.item(7), n);
}

TEST(ProcessGroup, AllGatherAndVariableAllGather) {
  const ProcessGroup w = ProcessGroup::world();
  const int64_t n = w.size(), r = w.rank();
  Tensor in = filled({2, 3}, DType::I64, static_cast<double>(r * 100), 1.0);
  Tensor out = Tensor::empty({2 * n, 3}, DType::I64);
  w.all_gather(in, out);
  for (int64_t k = 0; k < n; k++) EXPECT_EQ(out.item(k * 6 + 4), static_cast<double>(k * 100 + 4));
  // Rank k contributes k+1 rows (bf16 is moved bit for bit).
  std::vector<int64_t> rows;
  int64_t total = 0;
  for (int64_t k = 0; k < n; k++) {
    rows.push_back(k + 1);
    total += k + 1;
  }
  Tensor vin = filled({r + 1, 2}, DType::BF16, static_cast<double>(r), 0.0);
  Tensor vout = Tensor::empty({total, 2}, DType::BF16);
  comm::Work work = w.all_gather_v(vin, vout, rows, true);
  work.wait();
  int64_t row = 0;
  for (int64_t k = 0; k < n; k++)
    for (int64_t j = 0; j <= k; j++, row++) EXPECT_EQ(vout.item(row * 2 + 1), static_cast<double>(k));
}

TEST(ProcessGroup, ReduceScatterIsTheAdjointOfAllGather) {
  const ProcessGroup w = ProcessGroup::world();
  const int64_t n = w.size(), r = w.rank();
  Tensor in = filled({n * 2, 2}, DType::F64, static_cast<double>(r), 1.0);  // element i holds r + i
  Tensor out = Tensor::empty({2, 2}, DType::F64);
  w.reduce_scatter(in, out);
  // This rank's slice starts at element 4r; the sum over ranks of (k + 4r + i) is n(n-1)/2 + n(4r + i).
  for (int64_t i = 0; i < 4; i++) EXPECT_EQ(out.item(i), static_cast<double>(n * (n - 1) / 2 + n * (4 * r + i)));
}

TEST(ProcessGroup, VariableReduceScatterSumsEachRanksRows) {
  const ProcessGroup w = ProcessGroup::world();
  const int64_t n = w.size(), r = w.rank();
  std::vector<int64_t> rows(static_cast<size_t>(n));
  int64_t total = 0, before = 0;
  for (int64_t i = 0; i < n; i++) {
    rows[static_cast<size_t>(i)] = i + 1;  // rank i receives i + 1 rows of 3
    if (i < r) before += i + 1;
    total += i + 1;
  }
  Tensor in = filled({total, 3}, DType::F32, static_cast<double>(r), 1.0);  // element j holds r + j
  Tensor out = Tensor::empty({r + 1, 3}, DType::F32);
  w.reduce_scatter_v(in, out, rows);
  for (int64_t i = 0; i < out.numel(); i++)
    EXPECT_EQ(out.item(i), static_cast<double>(n * (n - 1) / 2 + n * (3 * before + i)));
}

TEST(ProcessGroup, AllToAllVWithUnevenCounts) {
  const ProcessGroup w = ProcessGroup::world();
  const int64_t n = w.size(), r = w.rank();
  // Rank r sends (r + d) % 3 rows to rank d; each row holds (source, destination, index).
  std::vector<int64_t> send(n), recv(n);
  int64_t ns = 0, nr = 0;
  for (int64_t d = 0; d < n; d++) {
    send[d] = (r + d) % 3;
    recv[d] = (d + r) % 3;
    ns += send[d];
    nr += recv[d];
  }
  Tensor in = Tensor::empty({ns, 3}, DType::I32), out = Tensor::empty({nr, 3}, DType::I32);
  int64_t row = 0;
  for (int64_t d = 0; d < n; d++)
    for (int64_t j = 0; j < send[d]; j++, row++) {
      in.set_item(row * 3, static_cast<double>(r));
      in.set_item(row * 3 + 1, static_cast<double>(d));
      in.set_item(row * 3 + 2, static_cast<double>(j));
    }
  w.all_to_all_v(in, send, out, recv);
  row = 0;
  for (int64_t s = 0; s < n; s++)
    for (int64_t j = 0; j < recv[s]; j++, row++) {
      EXPECT_EQ(out.item(row * 3), static_cast<double>(s));
      EXPECT_EQ(out.item(row * 3 + 1), static_cast<double>(r));
      EXPECT_EQ(out.item(row * 3 + 2), static_cast<double>(j));
    }
}

TEST(ProcessGroup, BroadcastSendRecvBarrier) {
  const ProcessGroup w = ProcessGroup::world();
  const int64_t n = w.size(), r = w.rank();
  Tensor b = filled({7}, DType::F32, r == 1 ? 42.0 : -1.0, 0.0);
  w.broadcast(b, 1);
  EXPECT_EQ(b.item(6), 42.0);
  // Ring: send to the next rank, receive from the previous, both posted before waiting.
  Tensor mine = filled({3}, DType::F64, static_cast<double>(r), 0.0), got = Tensor::empty({3}, DType::F64);
  comm::Work s = w.send(mine, (r + 1) % n, 7, true);
  comm::Work q = w.recv(got, (r + n - 1) % n, 7, true);
  q.wait();
  s.wait();
  EXPECT_EQ(got.item(2), static_cast<double>((r + n - 1) % n));
  w.barrier();
}

TEST(ProcessGroup, GroupsSplitFromParallelState) {
  const ProcessGroup w = ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  comm::ParallelState ps({4, 2, 1, 1, 2, 1});  // TP2 DP2; experts ETP1 EP2 EDP2
  const ProcessGroup tp = w.split(ps.tp), dp = w.split(ps.dp_groups), ep = w.split(ps.ep_groups);
  EXPECT_EQ(tp.size(), 2);
  EXPECT_EQ(tp.rank(), w.rank() % 2);
  Tensor t = filled({1}, DType::F64, static_cast<double>(w.rank()), 0.0);
  tp.all_reduce(t);
  EXPECT_EQ(t.item(0), w.rank() < 2 ? 1.0 : 5.0);  // {0,1} and {2,3}
  Tensor d = filled({1}, DType::F64, static_cast<double>(w.rank()), 0.0);
  dp.all_reduce(d);
  EXPECT_EQ(d.item(0), w.rank() % 2 == 0 ? 2.0 : 4.0);  // {0,2} and {1,3}
  EXPECT_EQ(ep.size(), 2);
}

}  // namespace
}  // namespace moecore

namespace {
// Ranks other than 0 print only their failures, each line marked with the rank, so a test that fails on one rank
// alone is named in the log (rank 0 prints everything as usual).
class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "rank %d: %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "rank %d: [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  moecore::comm::ProcessGroup::init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = static_cast<int>(moecore::comm::ProcessGroup::world().rank());
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  // Every rank's verdict counts: a failure on any rank fails the run.
  int all = rc;
  MOE_MPI(MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  moecore::comm::ProcessGroup::finalize();
  return all;
}
