// Helpers several benchmarks share: random operands, the median of timed runs, the machine they ran on, and a GEMM
// peak sampled between the timed runs. Not timing itself (core/timer.h) and not the GEMM kernels (kernels/cpu/gemm.h
// times them).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/gemm.h"

namespace moecore::cli {

// Fills `t` with normal(0, std) draws from stream `stream` of a fixed seed.
void fill_random(Tensor& t, uint64_t stream, double std);
// The median (upper middle) of `v`, non-empty.
double median(std::vector<double> v);

// The CPU a benchmark runs on: its model name and the widest matrix instruction set oneDNN can use there
// ("AMX", "AVX-512", "AVX2", "SSE"), from /proc/cpuinfo ("unknown" elsewhere).
struct Machine {
  std::string cpu_model, isa;
  bool bf16_native = false;  // oneDNN has a bf16 matmul here (otherwise bf16 operands are widened to f32)
};
Machine this_machine();
// "  machine: <model>, <ISA>, loops <level>[, bf16 widened to f32], <n> threads" on stdout (every benchmark prints it
// first); <level>: the copy the MOE_CPU_CLONES loops run (core/cpu.h clone_level).
void print_machine();

// A GEMM roofline measured in the same conditions as the timed work: sample() before each timed run and once after
// the last; each sample is the best of 3 M=N=K=2048 GEMMs of `dtype` (tens of milliseconds). On a shared machine
// the peak swings with the load, and the samples swing with the timed runs.
class PeakSampler {
 public:
  explicit PeakSampler(DType dtype, Device device = Device::cpu()) : dtype_(dtype), device_(device) {}
  void sample();
  double median() const;
  // "<dtype> GEMM peak X GFLOP/s: median of N samples taken between the timed runs, each the best of 3 M=N=K=2048
  // runs (range a-b)"
  std::string describe() const;
  const std::vector<double>& samples() const { return samples_; }

 private:
  DType dtype_;
  Device device_;
  std::vector<double> samples_;
};
// "<dtype> GEMM peak X GFLOP/s: median of N samples taken between <between>, each the best of 3 M=N=K=2048 runs
// on <device> (range a-b)", and on a second line a warning where the samples differ by more than
// kernels::kUnsteadyPeak.
std::string describe_peak(std::string_view dtype, const std::vector<double>& samples, Device device,
                          const char* between);
// The median of kernels::paired_peak_ratios: each timed run against the peak sampled on either side of it. On a
// machine whose speed drifts during the benchmark this compares like with like where the median peak does not. NaN
// where there are too few samples.
double paired_peak_ratio(const std::vector<double>& rates, const std::vector<double>& samples);
// "each run against the peak sampled on either side of it: ratio X (median of N runs, range a-b)"
std::string describe_paired(const std::vector<double>& rates, const std::vector<double>& samples);
// One such sample: GFLOP/s of the best of 3 square GEMMs of `dtype` (M=N=K=2048 on a CPU, 8192 on a GPU).
double gemm_peak_sample(DType dtype, Device device = Device::cpu());

// The CPU GEMMs of timed work by primitive shape (kernels::gemm_shape_stats): begin() before each timed run, end()
// after it; shapes() gives the mean per run, the most time first. With merge_rows, the expert GEMMs' row chunks
// (every M) count as one shape "M=*".
class GemmShapeTally {
 public:
  explicit GemmShapeTally(bool merge_rows = false) : merge_rows_(merge_rows) {}
  void begin();
  void end();
  std::vector<kernels::GemmShapeStats> shapes() const;

 private:
  std::map<std::string, kernels::GemmShapeStats> snapshot() const;
  bool merge_rows_;
  int runs_ = 0;
  std::map<std::string, kernels::GemmShapeStats> before_, sum_;
};
// "    <shape> <calls> calls <s> s <GFLOP/s> GFLOP/s <x> of the peak", a line for each of the first `most` shapes.
void print_gemm_shapes(const std::vector<kernels::GemmShapeStats>& shapes, double peak_gflops, size_t most);

}  // namespace moecore::cli
