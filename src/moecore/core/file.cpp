// Whole-file reads (see file.h).
#include "moecore/core/file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "moecore/core/error.h"

namespace moecore {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  MOE_CHECK(f.good(), "cannot open {} {}: {}", what, path, std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  MOE_CHECK(!f.bad(), "cannot read {} {}: {}", what, path, std::strerror(errno));
  return ss.str();
}

}  // namespace moecore
