// Helpers of the libFuzzer targets: a scratch directory of this process for parsers that read files.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace moecore::fuzz {

// <tmp>/moecore_<name>_<pid>, created empty on first use.
inline const std::filesystem::path& scratch_dir(const std::string& name) {
  static const std::filesystem::path dir = [&] {
    auto d = std::filesystem::temp_directory_path() / ("moecore_" + name + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write(const std::filesystem::path& p, const char* data, size_t size) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data, static_cast<std::streamsize>(size));
}

}  // namespace moecore::fuzz
