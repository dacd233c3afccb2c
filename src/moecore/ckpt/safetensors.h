// safetensors files (the format HuggingFace checkpoints use, and moecore's native shards): an 8-byte little-endian
// header length, a JSON header mapping each tensor name to {dtype, shape, data_offsets: [begin, end)} relative to
// the data section (plus an optional "__metadata__" object of strings), then the raw little-endian data. Nothing
// in the format executes code on load. Reading validates everything a corrupt or truncated file can get wrong
// and names the file and the problem.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::ckpt {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Writes `tensors` (in the given order) and `metadata` to `path`, fsynced. The caller handles atomic placement
// (write under a temporary name, then rename). `progress`: a label to show the bytes written under when the write
// takes a while (core/progress.h; empty: none).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, const std::string& progress = "");

struct SafetensorsEntry {
  DType dtype;  // as read: F32 for an F8_E4M3 tensor
  Shape shape;
  int64_t begin = 0, end = 0;  // byte offsets in the data section
  // Stored as F8_E4M3 (float8 e4m3fn, the FP8 of DeepSeek-V3's published checkpoints: one byte per element),
  // widened exactly to F32 on read.
  bool f8_e4m3 = false;
};

// An opened file: the parsed, validated header; tensors are read on demand.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // The tensor `name` in its stored dtype (F8_E4M3: widened to F32).
  Tensor read(const std::string& name) const;
  // Reads `name` into dst, which must have its entry's dtype and shape.
  void read_into(const std::string& name, Tensor& dst) const;

 private:
  std::string path_;
  int64_t data_start_ = 0, file_size_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// safetensors dtype names ("F32", "BF16", ...).
const char* safetensors_dtype(DType t);
// float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities; 0x7F and 0xFF are NaN)
// to its exact f32 value.
float f8_e4m3_to_f32(uint8_t b);

}  // namespace moecore::ckpt
