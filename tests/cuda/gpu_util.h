// GPU tests: each starts with MOE_REQUIRE_GPU(), which skips it with a one-line reason where no GPU is visible
// (a CPU-only build, no driver, no device), so CI compiles and "passes" them without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "moecore/device/runtime.h"

#define MOE_REQUIRE_GPU()                                                                                     \
  do {                                                                                                        \
    std::string moe_why_;                                                                                     \
    if (::moecore::device::visible_devices(&moe_why_) == 0) GTEST_SKIP() << "needs a CUDA GPU: " << moe_why_; \
  } while (0)
