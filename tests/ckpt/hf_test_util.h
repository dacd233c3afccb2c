// Helpers of the HuggingFace interop tests (test_hf.cpp, test_hf_deepseek.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "config_util.h"
#include "moecore/ckpt/safetensors.h"

namespace moecore::testing {

// A run over the HF test models' 96-token vocabulary, with `extra` flags.
inline train::TrainConfig hf_run_config(const std::vector<std::string>& extra) {
  return small_config(mock_run_flags(16, 2, 2, 96, 2, "1e-3"), extra);
}

// A small moecore MoE model's flags as a checkpoint stores them (2 layers, H 32, 4 SwiGLU experts), for the export
// refusals.
inline nlohmann::json small_moe_flags() {
  return {{"num-layers", 2},          {"hidden-size", 32},           {"num-attention-heads", 4},
          {"swiglu", true},           {"disable-bias-linear", true}, {"num-experts", 4},
          {"moe-ffn-hidden-size", 16}};
}

// max |a − b| / max |b| over [S][V] logits.
inline double max_rel(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double diff = 0, mx = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size() && s < b.size(); s++)
    for (size_t v = 0; v < a[s].size() && v < b[s].size(); v++) {
      diff = std::max(diff, std::fabs(a[s][v] - b[s][v]));
      mx = std::max(mx, std::fabs(b[s][v]));
    }
  return diff / mx;
}

// Every tensor of HF directory `a` is in `b` with the same dtype, shape and bytes, and nothing else is.
inline void expect_same_tensors(const std::string& a, const std::string& b) {
  auto tensors = [](const std::string& dir) {
    std::map<std::string, Tensor> m;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") {
        ckpt::SafetensorsFile f(e.path().string());
        for (const auto& [name, _] : f.entries()) m[name] = f.read(name);
      }
    return m;
  };
  const auto ta = tensors(a), tb = tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, x] : ta) {
    ASSERT_TRUE(tb.count(name)) << name;
    const Tensor& y = tb.at(name);
    ASSERT_EQ(x.dtype(), y.dtype()) << name;
    ASSERT_EQ(x.shape(), y.shape()) << name;
    ASSERT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << name;
  }
}

}  // namespace moecore::testing
