// Whole-file reads for small inputs (configs, tokenizers, markers, text corpora), and writes that are checked to
// the end: every write, flush, fsync, close and rename names the file and the OS error (a full disk is ENOSPC or
// EFBIG, never a silently short file). Not for tensor data (ckpt/ streams and maps those).
#pragma once

#include <cstdio>
#include <string>

namespace moecore {

// The bytes of `path`. `what` says what the file is in the error message ("tokenizer file", "--input").
std::string read_file(const std::string& path, const char* what);

// Writes `content` to `path` (created or truncated), fsyncs and closes it; the caller places it by rename.
void write_file_durable(const std::string& path, const std::string& content);
// Replaces `path` with `content` atomically: written to `path`.tmp, fsynced, renamed over `path`, the directory
// fsynced. On any failure the previous `path` is left as it was and the temporary removed.
void write_file_atomic(const std::string& path, const std::string& content);
// fsync of a directory, so that renames in it survive a crash.
void fsync_dir(const std::string& dir);
// std::filesystem::rename with the error named.
void rename_checked(const std::string& from, const std::string& to);
// fflush with the error named ("training log", "--metrics-file ...").
void flush_checked(std::FILE* f, const std::string& what);

// A text file written as a stream of lines (metrics, logs): each line written and flushed at once, every
// failure thrown with the file's name and the OS error; close() reports a failing close.
class LineFile {
 public:
  LineFile() = default;
  ~LineFile();
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;
  // Creates `path`, or appends to it when `append`.
  void open(const std::string& path, bool append);
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  void write_line(const std::string& line);
  void close();

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace moecore
