// Out-of-line part of the error macros, so the throwing path stays out of hot code.
#include "moecore/core/error.h"

namespace moecore {

void throw_internal(const char* cond, const char* file, int line, const std::string& detail) {
  std::string msg = fmt::format("internal error: assertion `{}` failed at {}:{}", cond, file, line);
  if (!detail.empty()) msg += ": " + detail;
  msg += " (this is a bug in moecore; please report it with the command that triggered it)";
  throw InternalError(msg);
}

}  // namespace moecore
