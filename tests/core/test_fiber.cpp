// Fiber (core/fiber.h): resume runs the function up to its next yield, yield returns to the resumer, locals survive
// across switches, an exception thrown inside comes out of resume, and yield outside a fiber does nothing.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "moecore/core/fiber.h"

namespace moecore {
namespace {

TEST(Fiber, AlternatesWithItsResumerAtEachYield) {
  std::string log;
  Fiber f([&] {
    std::string mine = "f";  // on the fiber's stack, alive across the switches
    for (int i = 0; i < 3; i++) {
      log += mine + std::to_string(i);
      EXPECT_EQ(Fiber::current() != nullptr, true);
      Fiber::yield();
    }
  });
  EXPECT_EQ(Fiber::current(), nullptr);
  for (int i = 0; !f.done(); i++) {
    log += "m" + std::to_string(i);
    f.resume();
  }
  EXPECT_EQ(log, "m0f0m1f1m2f2m3");
}

TEST(Fiber, RethrowsItsExceptionFromResume) {
  Fiber f([] {
    Fiber::yield();
    throw std::runtime_error("inside");
  });
  f.resume();
  EXPECT_FALSE(f.done());
  EXPECT_THROW(f.resume(), std::runtime_error);
  EXPECT_TRUE(f.done());
}

TEST(Fiber, YieldOutsideAFiberDoesNothing) {
  Fiber::yield();
  EXPECT_EQ(Fiber::current(), nullptr);
}

}  // namespace
}  // namespace moecore
