// The job's GPU placement and transport (see gpu_transport.h).
#include "moecore/comm/gpu_transport.h"

#include <fmt/format.h>

#include <climits>
#include <vector>

#include "moecore/comm/mpi_check.h"
#include "moecore/comm/nccl_comm.h"
#include "moecore/core/error.h"
#include "moecore/device/device_select.h"
#include "moecore/device/runtime.h"

namespace moecore::comm {

namespace {
GpuTransport g_transport = GpuTransport::HostStaged;
}

GpuTransport gpu_transport() {
  return g_transport;
}

void set_gpu_transport(GpuTransport t) {
  g_transport = t;
}

LocalRank local_rank(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  int me = 0;
  MOE_MPI(MPI_Comm_rank(world, &me));
  MOE_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node));
  LocalRank l;
  MOE_MPI(MPI_Comm_rank(node, &l.rank));
  MOE_MPI(MPI_Comm_size(node, &l.size));
  MOE_MPI(MPI_Comm_free(&node));
  return l;
}

Device place_ranks_on_gpus(std::string_view requested, std::string_view command, MPI_Comm world, std::string* line) {
  int me = 0, world_size = 1;
  MOE_MPI(MPI_Comm_rank(world, &me));
  MOE_MPI(MPI_Comm_size(world, &world_size));
  const LocalRank l = local_rank(world);
  const device::DeviceAvailability a = device::DeviceAvailability::probe();
  std::string error;
  Device d = Device::cpu();
  device::GpuPlacement p;
  try {
    d = device::resolve_device(requested, command, a);
    if (d.is_cuda()) {
      p = device::place_on_gpu(l.rank, l.size, a.visible, requested, built_with_nccl());
      MOE_CHECK(p.device < a.visible, "--device {}: this process sees {} GPU(s), numbered 0 to {}", requested,
                a.visible, a.visible - 1);
      d = Device::cuda(p.device);
    }
  } catch (const Error& e) {
    error = e.what();
  }
  // One agreed error: the lowest failing rank's message, on every rank.
  int first = error.empty() ? INT_MAX : me, agreed = INT_MAX;
  MOE_MPI(MPI_Allreduce(&first, &agreed, 1, MPI_INT, MPI_MIN, world));
  if (agreed != INT_MAX) {
    int n = static_cast<int>(error.size());
    MOE_MPI(MPI_Bcast(&n, 1, MPI_INT, agreed, world));
    std::vector<char> text(static_cast<size_t>(n));
    if (me == agreed) std::copy(error.begin(), error.end(), text.begin());
    MOE_MPI(MPI_Bcast(text.data(), n, MPI_CHAR, agreed, world));
    const std::string msg(text.begin(), text.end());
    throw Error(world_size > 1 ? fmt::format("rank {}: {}", agreed, msg) : msg);
  }
  // Every rank on the GPU or none (--device and the availability agree by check_ranks_agree and the error above);
  // NCCL only when every rank can.
  int mine = d.is_cuda() && p.nccl ? 1 : 0, all = 0;
  MOE_MPI(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, world));
  set_gpu_transport(all ? GpuTransport::Nccl : GpuTransport::HostStaged);
  if (d.is_cuda()) device::set_current_device(d);
  if (line) *line = d.is_cuda() ? device::describe_placement(p, l.size, a.visible, all != 0, built_with_nccl()) : "";
  return d;
}

}  // namespace moecore::comm
