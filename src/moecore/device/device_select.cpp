// --device parsing and choice (see device_select.h).
#include "moecore/device/device_select.h"

#include <fmt/format.h>

#include <charconv>

#include "moecore/core/error.h"
#include "moecore/device/runtime.h"

namespace moecore::device {

DeviceAvailability DeviceAvailability::probe() {
  DeviceAvailability a;
  a.built_with_cuda = moecore::device::built_with_cuda();
  a.visible = visible_devices(&a.why_none);
  return a;
}

namespace {
// -1 when s is not cuda / cuda:N; the ordinal otherwise.
int cuda_ordinal(std::string_view s) {
  if (s == "cuda") return 0;
  if (s.substr(0, 5) != "cuda:" || s.size() == 5) return -1;
  int n = -1;
  auto [p, ec] = std::from_chars(s.data() + 5, s.data() + s.size(), n);
  return ec == std::errc() && p == s.data() + s.size() && n >= 0 ? n : -1;
}
}  // namespace

DeviceAvailability DeviceAvailability::assumed_for(std::string_view requested) {
  const int n = cuda_ordinal(requested);
  if (n < 0) return probe();
  return {true, n + 1, ""};
}

bool is_device_name(std::string_view s) {
  return s == "auto" || s == "cpu" || cuda_ordinal(s) >= 0;
}

Device resolve_device(std::string_view requested, std::string_view command, const DeviceAvailability& a) {
  MOE_CHECK(is_device_name(requested), "--device {}: not a device; accepted: auto, cpu, cuda, cuda:N", requested);
  if (requested == "cpu") return Device::cpu();
  if (requested == "auto") return a.built_with_cuda && a.visible > 0 ? Device::cuda(0) : Device::cpu();
  const int n = cuda_ordinal(requested);
  MOE_CHECK(a.built_with_cuda,
            "--device {}: this moecore was built without CUDA, so `moecore {}` cannot use a GPU; rebuild with "
            "-DMOECORE_CUDA=ON where the CUDA toolkit is installed, or use --device cpu",
            requested, command);
  MOE_CHECK(a.visible > 0, "--device {}: no GPU is visible to this process ({}); use --device cpu or --device auto",
            requested, a.why_none.empty() ? "0 devices" : a.why_none);
  MOE_CHECK(n < a.visible, "--device {}: this process sees {} GPU(s), numbered 0 to {}", requested, a.visible,
            a.visible - 1);
  return Device::cuda(n);
}

GpuPlacement place_on_gpu(int local_rank, int local_size, int visible, std::string_view requested, bool nccl_built) {
  MOE_ASSERT_MSG(local_rank >= 0 && local_rank < local_size && visible > 0, "local rank {} of {}, {} GPUs", local_rank,
                 local_size, visible);
  GpuPlacement p;
  const int pinned = requested == "cuda" || requested == "auto" ? -1 : cuda_ordinal(requested);
  if (pinned >= 0) {
    p.device = pinned;
    p.owns_gpu = local_size == 1;
  } else if (local_size <= visible) {
    p.device = local_rank;
    p.owns_gpu = true;
  } else {
    p.device = local_rank % visible;
    p.owns_gpu = false;
  }
  p.nccl = p.owns_gpu && nccl_built;
  return p;
}

std::string describe_placement(const GpuPlacement& p, int local_size, int visible, bool job_nccl, bool nccl_built) {
  const std::string ranks = fmt::format("{} rank{} on this node", local_size, local_size == 1 ? "" : "s");
  if (job_nccl) return fmt::format("{}, one GPU each (cuda:<local rank>): NCCL between GPUs", ranks);
  if (!p.owns_gpu)
    return fmt::format(
        "{} share {} visible GPU(s): GPU tensors go between ranks through host-staged MPI (NCCL needs one GPU "
        "per rank: run at most {} ranks per node, or make more GPUs visible)",
        ranks, visible, visible);
  return fmt::format("{}, one GPU each: GPU tensors go between ranks through host-staged MPI ({})", ranks,
                     nccl_built ? "ranks on another node share GPUs" : "this moecore was built without NCCL");
}

}  // namespace moecore::device
