// Shared benchmark helpers (see common.h).
#include "moecore/cli/bench/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "moecore/core/cpu.h"
#include "moecore/core/error.h"
#include "moecore/core/rng.h"
#include "moecore/kernels/gemm.h"

namespace moecore::cli {

void fill_random(Tensor& t, uint64_t stream, double std) {
  Philox rng(1234, stream);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, std * rng.normal(static_cast<uint64_t>(i)));
}

double median(std::vector<double> v) {
  MOE_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Machine this_machine() {
  Machine m{"unknown", "unknown", kernels::gemm_stats().bf16_native};
  std::ifstream in("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && m.cpu_model == "unknown") m.cpu_model = value;
    if (key == "flags" && flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
    }
  }
  if (flags.count("amx_tile") && flags.count("amx_bf16"))
    m.isa = "AMX";
  else if (flags.count("avx512f"))
    m.isa = flags.count("avx512_bf16") ? "AVX-512 (with AVX512-BF16)" : "AVX-512";
  else if (flags.count("avx2"))
    m.isa = "AVX2";
  else if (!flags.empty())
    m.isa = "SSE";
  if (max_cpu_isa() != CpuIsa::Amx)
    m.isa += fmt::format(" (capped at {} by MOECORE_MAX_CPU_ISA)", cpu_isa_name(max_cpu_isa()));
  return m;
}

void print_machine() {
  const Machine m = this_machine();
  fmt::print("  machine: {}, {}, loops {}{}, {} threads\n", m.cpu_model, m.isa, clone_level_name(clone_level()),
             m.bf16_native ? "" : ", bf16 widened to f32", num_threads());
}

double gemm_peak_sample(DType dtype, Device device) {
  return kernels::time_square_gemm(dtype, kernels::peak_gemm_size(device), 3, device).first;
}

void PeakSampler::sample() {
  samples_.push_back(gemm_peak_sample(dtype_, device_));
}

double PeakSampler::median() const {
  return cli::median(samples_);
}

std::string describe_peak(std::string_view dtype, const std::vector<double>& samples, Device device,
                          const char* between) {
  MOE_ASSERT(!samples.empty());
  const double lo = *std::min_element(samples.begin(), samples.end()),
               hi = *std::max_element(samples.begin(), samples.end());
  std::string s = fmt::format(
      "{} GEMM peak {:.1f} GFLOP/s: median of {} samples taken between {}, each the best of 3 M=N=K={} runs on {} "
      "(range {:.1f}-{:.1f})",
      dtype, cli::median(samples), samples.size(), between, kernels::peak_gemm_size(device), device.str(), lo, hi);
  const double swing = kernels::peak_swing(samples);
  if (swing > kernels::kUnsteadyPeak)
    s += fmt::format(
        "\n  warning: the peak samples differ {:.1f}x: this machine's speed changed during the run (other work on "
        "it, or clock changes), so the ratios to the peak are not reliable; run again when it is quiet",
        swing);
  return s;
}

double paired_peak_ratio(const std::vector<double>& rates, const std::vector<double>& samples) {
  const std::vector<double> r = kernels::paired_peak_ratios(rates, samples);
  return r.empty() ? std::nan("") : cli::median(r);
}

std::string describe_paired(const std::vector<double>& rates, const std::vector<double>& samples) {
  const std::vector<double> r = kernels::paired_peak_ratios(rates, samples);
  if (r.empty()) return "each run against the peak on either side of it: too few peak samples";
  return fmt::format(
      "each run against the peak sampled on either side of it: ratio {:.3f} (median of {} runs, range "
      "{:.3f}-{:.3f})",
      cli::median(r), r.size(), *std::min_element(r.begin(), r.end()), *std::max_element(r.begin(), r.end()));
}

std::string PeakSampler::describe() const {
  return describe_peak(dtype_name(dtype_), samples_, device_, "the timed runs");
}

std::map<std::string, kernels::GemmShapeStats> GemmShapeTally::snapshot() const {
  std::map<std::string, kernels::GemmShapeStats> m;
  for (kernels::GemmShapeStats g : kernels::gemm_shape_stats()) {
    if (merge_rows_) g.M = 0;
    auto [it, fresh] = m.try_emplace(g.describe(), g);
    if (!fresh) it->second.calls += g.calls, it->second.flops += g.flops, it->second.seconds += g.seconds;
  }
  return m;
}

void GemmShapeTally::begin() {
  before_ = snapshot();
}

void GemmShapeTally::end() {
  runs_++;
  for (const auto& [name, g] : snapshot()) {
    const auto b = before_.find(name);
    const bool seen = b != before_.end();
    auto [it, fresh] = sum_.try_emplace(name, g);
    if (fresh) it->second.calls = 0, it->second.flops = it->second.seconds = 0;
    it->second.calls += g.calls - (seen ? b->second.calls : 0);
    it->second.flops += g.flops - (seen ? b->second.flops : 0.0);
    it->second.seconds += g.seconds - (seen ? b->second.seconds : 0.0);
  }
}

std::vector<kernels::GemmShapeStats> GemmShapeTally::shapes() const {
  std::vector<kernels::GemmShapeStats> v;
  for (const auto& [name, g] : sum_) {
    if (g.calls <= 0 || runs_ == 0) continue;
    kernels::GemmShapeStats m = g;
    m.calls /= runs_;
    m.flops /= runs_;
    m.seconds /= runs_;
    v.push_back(m);
  }
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return v;
}

void print_gemm_shapes(const std::vector<kernels::GemmShapeStats>& v, double peak_gflops, size_t most) {
  for (size_t i = 0; i < v.size() && i < most; i++) {
    const kernels::GemmShapeStats& g = v[i];
    const double rate = g.seconds > 0 ? g.flops / g.seconds / 1e9 : 0.0;
    fmt::print("    {:<44} {:4} calls {:7.3f} s  {:7.1f} GFLOP/s  {:.2f} of the peak\n", g.describe(), g.calls,
               g.seconds, rate, rate / peak_gflops);
  }
}

}  // namespace moecore::cli
