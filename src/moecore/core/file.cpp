// Whole-file reads and checked writes (see file.h).
#include "moecore/core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
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

void write_file_durable(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MOE_CHECK(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t w = ::write(fd, content.data() + done, content.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;  // a write of 0 bytes: the device took nothing
      ::close(fd);
      MOE_CHECK(false, "cannot write {}: {}", path, std::strerror(err));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    MOE_CHECK(false, "cannot fsync {}: {}", path, std::strerror(err));
  }
  MOE_CHECK(::close(fd) == 0, "cannot close {}: {}", path, std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  MOE_CHECK(fd >= 0, "cannot open directory {}: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MOE_CHECK(rc == 0, "cannot fsync directory {}: {}", dir, std::strerror(err));
}

void rename_checked(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  MOE_CHECK(!ec, "cannot rename {} to {}: {}", from, to, ec.message());
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  try {
    write_file_durable(tmp, content);
    rename_checked(tmp, path);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // the previous `path` is untouched
    throw;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

void flush_checked(std::FILE* f, const std::string& what) {
  MOE_CHECK(std::fflush(f) == 0 && !std::ferror(f), "cannot write the {}: {}", what, std::strerror(errno));
}

void LineFile::open(const std::string& path, bool append) {
  MOE_ASSERT(f_ == nullptr);
  path_ = path;
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  MOE_CHECK(f_ != nullptr, "cannot open {} for writing: {}", path, std::strerror(errno));
}

LineFile::~LineFile() {
  if (f_) std::fclose(f_);  // an error here was reported by the last write_line's flush
}

void LineFile::write_line(const std::string& line) {
  MOE_ASSERT(f_ != nullptr);
  const bool ok = std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fputc('\n', f_) != EOF &&
                  std::fflush(f_) == 0;
  MOE_CHECK(ok, "cannot write {}: {}", path_, std::strerror(errno));
}

void LineFile::close() {
  if (!f_) return;
  const int rc = std::fclose(f_);
  f_ = nullptr;
  MOE_CHECK(rc == 0, "cannot close {}: {}", path_, std::strerror(errno));
}

}  // namespace moecore
