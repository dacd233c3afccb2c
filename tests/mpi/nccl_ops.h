// Every ProcessGroup operation once, on GPU tensors, with the current GPU transport (comm/gpu_transport.h): the
// NCCL tests run it over NCCL and over host-staged MPI and compare (tests/mpi/test_gpu_nccl.cpp under mpirun,
// tests/cuda/test_nccl_one_rank.cpp on a group of one rank).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moecore/comm/process_group.h"

namespace moecore::testing {

inline Tensor filled(const Shape& s, int64_t rank, int salt, Device d) {
  Tensor h = Tensor::empty(s, DType::F32);
  float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); i++)
    p[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * static_cast<double>(rank) + salt));
  return h.to(d);
}

// Runs every operation once on `g` with the current transport; the results on the host, in order.
inline std::vector<Tensor> every_operation(const comm::ProcessGroup& g, Device d) {
  const int64_t P = g.size(), me = g.rank();
  std::vector<Tensor> out;
  auto keep = [&](const Tensor& t) { out.push_back(t.to(Device::cpu())); };
  {
    Tensor t = filled({1000}, me, 1, d);
    g.all_reduce(t);
    keep(t);
    Tensor m = filled({33}, me, 2, d);
    g.all_reduce(m, comm::ReduceOp::Max);
    keep(m);
  }
  {
    Tensor in = filled({7, 3}, me, 3, d), o = Tensor::empty({P * 7, 3}, DType::F32, d);
    g.all_gather(in, o);
    keep(o);
  }
  {
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (int64_t r = 0; r < P; r++) total += (rows.emplace_back(r + 1), r + 1);
    Tensor in = filled({me + 1, 3}, me, 4, d), o = Tensor::empty({total, 3}, DType::F32, d);
    g.all_gather_v(in, o, rows);
    keep(o);
  }
  {
    Tensor in = filled({P * 5, 2}, me, 5, d), o = Tensor::empty({5, 2}, DType::F32, d);
    g.reduce_scatter(in, o);
    keep(o);
  }
  {
    Tensor buf = filled({P * 6}, me, 6, d);
    g.reduce_scatter_in_place(buf);
    keep(buf.slice(me * 6, 6));
  }
  {
    Tensor buf = filled({P * 4}, me, 7, d);
    g.all_gather_in_place(buf);
    keep(buf);
  }
  {
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (int64_t r = 0; r < P; r++) total += (rows.emplace_back(r + 2), r + 2);
    Tensor in = filled({total, 3}, me, 8, d), o = Tensor::empty({me + 2, 3}, DType::F32, d);
    g.reduce_scatter_v(in, o, rows);
    keep(o);
  }
  {
    std::vector<int64_t> send_rows, recv_rows;  // rank a sends (a + b) % 3 + 1 rows to rank b
    int64_t ns = 0, nr = 0;
    for (int64_t r = 0; r < P; r++) {
      ns += send_rows.emplace_back((me + r) % 3 + 1);
      nr += recv_rows.emplace_back((r + me) % 3 + 1);
    }
    Tensor in = filled({ns, 4}, me, 9, d), o = Tensor::empty({nr, 4}, DType::F32, d);
    g.all_to_all_v(in, send_rows, o, recv_rows);
    keep(o);
  }
  {
    Tensor t = filled({17}, me, 10, d);
    g.broadcast(t, P - 1);
    keep(t);
  }
  {  // a ring step, asynchronous: polled with test() until done
    Tensor s = filled({9, 2}, me, 11, d), r = Tensor::zeros({9, 2}, DType::F32, d);
    auto [ws, wr] = g.send_recv(s, (me + 1) % P, r, (me + P - 1) % P, 3, /*async=*/true);
    while (!wr.test()) {
    }
    ws.wait();
    keep(r);
  }
  if (P >= 2 && me < 2) {  // ranks 0 and 1: a message there and back, each side in matching order
    Tensor there = filled({5}, me, 12, d), back = Tensor::zeros({5}, DType::F32, d);
    if (me == 0) {
      g.send(there, 1, 4);
      g.recv(back, 1, 5);
    } else {
      g.recv(back, 0, 4);
      g.send(there, 0, 5);
    }
    keep(back);
  }
  {  // asynchronous all-reduce overlapped with work on the current stream
    Tensor t = filled({4096}, me, 13, d);
    comm::Work w = g.all_reduce(t, comm::ReduceOp::Sum, /*async=*/true);
    Tensor busy = filled({4096}, me, 14, d);
    w.wait();
    keep(t);
  }
  return out;
}

// Element by element within `rel` (relative to max(1, |host|)).
inline void expect_same_results(const std::vector<Tensor>& nccl, const std::vector<Tensor>& host, double rel) {
  ASSERT_EQ(nccl.size(), host.size());
  for (size_t i = 0; i < nccl.size(); i++) {
    ASSERT_EQ(nccl[i].numel(), host[i].numel()) << "operation " << i;
    const float* a = nccl[i].data<float>();
    const float* b = host[i].data<float>();
    for (int64_t j = 0; j < nccl[i].numel(); j++)
      ASSERT_NEAR(a[j], b[j], rel * std::max(1.0f, std::fabs(b[j]))) << "operation " << i << " element " << j;
  }
}

}  // namespace moecore::testing
