// The GPU profile (gpu_profile.h) in a CPU-only build: no profiler can be made, so the scopes and probes that test
// the installed one never do anything.
#include "moecore/core/error.h"
#include "moecore/device/gpu_profile.h"

namespace moecore::device {

struct GpuProfiler::Impl {};

namespace profile_detail {
GpuProfiler::Impl* g_active = nullptr;
bool enter(Phase) {
  return false;
}
void leave() {}
void note_sync(const char*, size_t, double) {}
double now() {
  return 0.0;
}
}  // namespace profile_detail

GpuProfiler::GpuProfiler(Device d) {
  MOE_CHECK(false,
            "the GPU profile on {}: this moecore was built without CUDA (rebuild with -DMOECORE_CUDA=ON, or use "
            "--device cpu)",
            d.str());
}
GpuProfiler::~GpuProfiler() = default;
void GpuProfiler::begin_step() {}
void GpuProfiler::end_step() {}
void GpuProfiler::reset() {}
GpuProfileReport GpuProfiler::report(size_t) const {
  return {};
}

}  // namespace moecore::device
