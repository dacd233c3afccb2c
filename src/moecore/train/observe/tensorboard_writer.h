// One TensorBoard event file: TFRecord framing (length, masked CRC-32C of the length, the record, masked CRC-32C
// of the record) around tensorboard.Event protobufs (train/tensorboard/event.proto, built with Debian's protobuf
// library). Records wait in memory and go to the file every `queue_size` records, after `flush_secs` seconds, and
// on flush() and close(): what PyTorch's SummaryWriter(max_queue, flush_secs=120) does, without its thread. Every
// write, flush and close is checked: a full disk ends the run naming the file.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace moecore::train {

// TensorBoard's HistogramProto in plain numbers: bucket i counts the values in (bucket_limit[i-1], bucket_limit[i]].
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};

// Tokens per expert as a histogram over the expert index: expert e's bucket is (e - 0.5, e + 0.5] and holds its
// token count, so TensorBoard's histogram view draws the load per expert (num is the tokens routed in all).
Histogram expert_load_histogram(const std::vector<int64_t>& tokens_per_expert);

// The TFRecord framing of one record (exposed for the framing test).
std::string tfrecord_frame(std::string_view record);

class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and events.out.tfevents.<unix seconds>.<hostname>.<pid> in it, and writes
  // the file-version record. Errors name `dir`. `queue_size` <= 0: no limit (as Python's queue.Queue).
  EventFileWriter(const std::string& dir, int64_t queue_size, double flush_secs = 120);
  ~EventFileWriter();  // close(); an error there is printed (a destructor cannot throw)
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_histogram(const std::string& tag, const Histogram& h, int64_t step);
  // Writes the waiting records and fflushes the file.
  void flush();
  void close();
  const std::string& path() const { return path_; }

 private:
  void add_record(const std::string& event_bytes);
  std::FILE* f_ = nullptr;
  std::string path_;
  int64_t queue_size_;
  double flush_secs_;
  std::string pending_;  // framed records not yet written
  int64_t pending_records_ = 0;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace moecore::train
