// Test helpers: deterministic random tensors and the fp64 finite-difference gradient check every op and module
// goes through.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>

#include "moecore/core/error.h"
#include "moecore/core/rng.h"
#include "moecore/core/tensor.h"

namespace moecore::testing {

inline Tensor randn(const Shape& s, DType dt, uint64_t stream, double std = 1.0) {
  Tensor t = Tensor::empty(s, dt);
  Philox rng(42, stream);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, std * rng.normal(static_cast<uint64_t>(i)));
  return t;
}

// A tensor of shape s and dtype dt holding the values v in order (as many as it has elements).
inline Tensor tensor_of(const Shape& s, DType dt, std::initializer_list<double> v) {
  Tensor t = Tensor::empty(s, dt);
  int64_t i = 0;
  for (double x : v) t.set_item(i++, x);
  EXPECT_EQ(i, t.numel());
  return t;
}

inline Tensor randint(const Shape& s, int64_t hi, uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::I64);
  Philox rng(7, stream);
  for (int64_t i = 0; i < t.numel(); i++) t.data<int64_t>()[i] = static_cast<int64_t>(rng.block(i)[0] % hi);
  return t;
}

// max |a - b| / max(|b|max, tiny)
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); i++) {
    num = std::max(num, std::fabs(a.item(i) - b.item(i)));
    den = std::max(den, std::fabs(b.item(i)));
  }
  return num / std::max(den, 1e-300);
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Central differences of `loss` with respect to the elements of `x` (f64), compared with `grad` as a norm-wise
// relative error ‖num − ana‖ / max(‖num‖, ‖ana‖). At most `max_elems` elements are probed, evenly spread.
inline double fd_rel_error(const std::function<double()>& loss, Tensor& x, const Tensor& grad, int64_t max_elems = 400,
                           double eps = 1e-6) {
  EXPECT_EQ(x.dtype(), DType::F64);
  EXPECT_EQ(x.numel(), grad.numel());
  const int64_t n = x.numel();
  const int64_t step = std::max<int64_t>(1, n / max_elems);
  double diff2 = 0, num2 = 0, ana2 = 0;
  for (int64_t i = 0; i < n; i += step) {
    double* p = x.data<double>() + i;
    const double orig = *p;
    *p = orig + eps;
    const double lp = loss();
    *p = orig - eps;
    const double lm = loss();
    *p = orig;
    const double num = (lp - lm) / (2 * eps);
    const double ana = grad.item(i);
    diff2 += (num - ana) * (num - ana);
    num2 += num * num;
    ana2 += ana * ana;
  }
  const double den = std::sqrt(std::max(num2, ana2));
  EXPECT_GT(den, 1e-12) << "gradient is identically zero: the check would be vacuous";
  return std::sqrt(diff2) / std::max(den, 1e-300);
}

constexpr double kGradTol = 1e-6;

// The message of the moecore::Error `f` throws ("" if none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The message of the moecore::Error `f` throws; fails the test when `f` throws anything else or nothing (parsers of
// untrusted input must answer every input with a user error).
inline std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a moecore::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

// A scratch path under the temporary directory that belongs to this process (the unit tests run two at a time:
// ctest -j2), not created; `name` ends it, extension included.
inline std::string process_temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("moecore_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// An empty scratch path of this process: removed if it exists, not created.
inline std::string fresh_temp_path(const std::string& name) {
  const std::string p = process_temp_path(name);
  std::filesystem::remove_all(p);
  return p;
}

// A FILE* that swallows what a Trainer writes.
struct NullOut {
  std::FILE* f = std::fopen("/dev/null", "w");
  ~NullOut() { std::fclose(f); }
};

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

#ifdef MOECORE_SOURCE_DIR
// The standard output of an independent reference (tests/models/*.py, tests/ckpt/*.py) run by the system python3
// with NumPy: `script_and_args` from the source tree's root. The test fails when it exits non-zero.
inline std::string python_reference(const std::string& script_and_args) {
  const std::string cmd = "/usr/bin/python3 " + std::string(MOECORE_SOURCE_DIR) + "/" + script_and_args;
  std::FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  std::string out;
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd << " (is python3-numpy installed? scripts/install-deps.sh)";
  return out;
}
#endif

// A whole file's bytes.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace moecore::testing
