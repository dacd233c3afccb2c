// Event files (see tensorboard_writer.h).
#include "moecore/train/observe/tensorboard_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "moecore/core/crc32c.h"
#include "moecore/core/error.h"
#include "moecore/train/observe/tensorboard/event.pb.h"

namespace moecore::train {

namespace {
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}
}  // namespace

Histogram expert_load_histogram(const std::vector<int64_t>& tokens) {
  Histogram h;
  bool any = false;
  for (size_t e = 0; e < tokens.size(); e++) {
    const double x = static_cast<double>(e), n = static_cast<double>(tokens[e]);
    h.bucket_limit.push_back(x + 0.5);
    h.bucket.push_back(n);
    if (n <= 0) continue;
    h.min = any ? std::min(h.min, x) : x;
    h.max = any ? std::max(h.max, x) : x;
    any = true;
    h.num += n;
    h.sum += n * x;
    h.sum_squares += n * x * x;
  }
  return h;
}

std::string tfrecord_frame(std::string_view record) {
  std::string out;
  out.reserve(record.size() + 16);
  put_le(out, record.size(), 8);
  put_le(out, mask_crc32c(crc32c(out.data(), 8)), 4);
  out.append(record);
  put_le(out, mask_crc32c(crc32c(record)), 4);
  return out;
}

EventFileWriter::EventFileWriter(const std::string& dir, int64_t queue_size, double flush_secs)
    : queue_size_(queue_size > 0 ? queue_size : std::numeric_limits<int64_t>::max()), flush_secs_(flush_secs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MOE_CHECK(!ec, "--tensorboard-dir {}: cannot create the directory: {}", dir, ec.message());
  const auto secs = static_cast<int64_t>(std::floor(wall_time()));
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}", secs, host_name(), ::getpid()))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  MOE_CHECK(f_ != nullptr, "--tensorboard-dir: cannot create {}: {}", path_, std::strerror(errno));
  last_flush_ = std::chrono::steady_clock::now();
  tensorboard::Event ev;
  ev.set_wall_time(wall_time());
  ev.set_file_version("brain.Event:2");
  add_record(ev.SerializeAsString());
  flush();  // TensorBoard sees the run at once
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  tensorboard::Event ev;
  ev.set_wall_time(wall_time());
  ev.set_step(step);
  tensorboard::Summary::Value* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));  // TensorBoard's scalars are float32, as add_scalar writes them
  add_record(ev.SerializeAsString());
}

void EventFileWriter::add_histogram(const std::string& tag, const Histogram& h, int64_t step) {
  tensorboard::Event ev;
  ev.set_wall_time(wall_time());
  ev.set_step(step);
  tensorboard::Summary::Value* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  tensorboard::HistogramProto* p = v->mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sum_squares);
  for (double b : h.bucket_limit) p->add_bucket_limit(b);
  for (double b : h.bucket) p->add_bucket(b);
  add_record(ev.SerializeAsString());
}

void EventFileWriter::add_record(const std::string& event_bytes) {
  MOE_ASSERT_MSG(f_ != nullptr, "event file {} written after close", path_);
  pending_ += tfrecord_frame(event_bytes);
  pending_records_++;
  const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count();
  if (pending_records_ >= queue_size_ || since >= flush_secs_) flush();
}

void EventFileWriter::flush() {
  if (!f_) return;
  const bool ok = std::fwrite(pending_.data(), 1, pending_.size(), f_) == pending_.size() && std::fflush(f_) == 0;
  pending_.clear();
  pending_records_ = 0;
  last_flush_ = std::chrono::steady_clock::now();
  MOE_CHECK(ok, "--tensorboard-dir: cannot write {}: {}", path_, std::strerror(errno));
}

void EventFileWriter::close() {
  if (!f_) return;
  std::string err;
  try {
    flush();
  } catch (const Error& e) {
    err = e.what();
  }
  const int rc = std::fclose(f_);
  f_ = nullptr;
  MOE_CHECK(err.empty(), "{}", err);
  MOE_CHECK(rc == 0, "--tensorboard-dir: cannot close {}: {}", path_, std::strerror(errno));
}

}  // namespace moecore::train
