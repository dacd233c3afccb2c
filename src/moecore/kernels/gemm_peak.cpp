// The GEMM peak that the roofline benchmarks and the trainer's MFU divide by (gemm.h measure_gemm_peak_gflops):
// square products timed through the API's gemm on the device asked for, which picks their sizes. A measurement over
// the kernels, not a kernel.
#include <algorithm>
#include <vector>

#include "moecore/core/timer.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/gemm.h"

namespace moecore::kernels {

std::pair<double, double> time_square_gemm(DType dtype, int64_t n, int iters, Device device) {
  Tensor a = Tensor::empty({n, n}, DType::F32), b = Tensor::empty({n, n}, DType::F32);
  float* pa = a.data<float>();
  float* pb = b.data<float>();
  for (int64_t i = 0; i < n * n; i++) {  // values in [-1, 1), cheap and deterministic
    pa[i] = static_cast<float>((i * 7919) % 2001) / 1000.0f - 1.0f;
    pb[i] = static_cast<float>((i * 104729) % 2003) / 1001.0f - 1.0f;
  }
  Tensor A = a.to(dtype).to(device), B = b.to(dtype).to(device), C = Tensor::empty({n, n}, DType::F32, device);
  // A GPU runs asynchronously: each timed product ends with a synchronisation, so the host clock sees its work.
  auto sync = [&] {
    if (device.is_cuda()) moecore::device::synchronize();
  };
  gemm(A, false, B, false, C);  // warm-up: creates the primitive (the cuBLASLt plan)
  sync();
  std::vector<double> rates;
  for (int i = 0; i < iters; i++) {
    const Stopwatch timer;
    gemm(A, false, B, false, C);
    sync();
    const double dt = timer.seconds();
    rates.push_back(2.0 * static_cast<double>(n) * n * n / dt / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return {rates.back(), rates[rates.size() / 2]};
}

double peak_swing(const std::vector<double>& samples) {
  if (samples.empty()) return 1.0;
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  return *lo > 0 ? *hi / *lo : 1.0;
}

std::vector<double> paired_peak_ratios(const std::vector<double>& rates, const std::vector<double>& samples) {
  std::vector<double> r;
  if (rates.empty() || samples.size() < rates.size() + 1) return r;
  const size_t first = samples.size() - rates.size() - 1;
  for (size_t i = 0; i < rates.size(); i++)
    r.push_back(rates[i] / (0.5 * (samples[first + i] + samples[first + i + 1])));
  return r;
}

double measure_gemm_peak_gflops(DType dtype, Device device) {
  double best = 0;
  if (device.is_cuda()) {  // the cuBLAS peak: sizes that fill the GPU
    for (int64_t n : {4096, 8192}) best = std::max(best, time_square_gemm(dtype, n, 3, device).first);
    return best;
  }
  for (int64_t n : {1024, 2048}) best = std::max(best, time_square_gemm(dtype, n, n == 2048 ? 3 : 6).first);
  return best;
}

int64_t peak_gemm_size(Device d) {
  return d.is_cuda() ? 8192 : 2048;
}

}  // namespace moecore::kernels
