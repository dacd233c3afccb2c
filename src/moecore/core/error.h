// Two kinds of check. MOE_CHECK is for user input (flags, files, shapes a caller chose): its message says what is
// wrong, the offending value and how to fix it. MOE_ASSERT is for internal invariants: it names file and line.
// Both throw, so a command-line front end can print one clean message and exit non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moecore {

// A mistake by the user: wrong flag, bad file, incompatible sizes.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A broken invariant inside moecore: a bug, never the user's fault.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

[[noreturn]] void throw_internal(const char* cond, const char* file, int line, const std::string& detail);

}  // namespace moecore

#define MOE_CHECK(cond, ...)                                       \
  do {                                                             \
    if (!(cond)) throw ::moecore::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define MOE_ASSERT(cond)                                                   \
  do {                                                                     \
    if (!(cond)) ::moecore::throw_internal(#cond, __FILE__, __LINE__, ""); \
  } while (0)

#define MOE_ASSERT_MSG(cond, ...)                                                                \
  do {                                                                                           \
    if (!(cond)) ::moecore::throw_internal(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
