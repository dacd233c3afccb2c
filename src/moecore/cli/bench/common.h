// Helpers several benchmarks share: random operands and the median of timed runs. Not timing itself
// (core/timer.h) and not the GEMM roofline (kernels/cpu/gemm.h measures it).
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::cli {

// Fills `t` with normal(0, std) draws from stream `stream` of a fixed seed.
void fill_random(Tensor& t, uint64_t stream, double std);
// The median (upper middle) of `v`, non-empty.
double median(std::vector<double> v);

}  // namespace moecore::cli
