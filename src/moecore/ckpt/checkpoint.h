// The native checkpoint's model state, layout-free: every rank writes the parameter shards it is responsible for
// into its own safetensors file, with an index fragment recording for each shard its global name, the global
// view it is a box of (Parameter::set_shard), the box, the dtype and an XXH3-64 checksum of its bytes. The fragments
// are merged into index.json only after every name is checked to be tiled exactly once. Loading reads, for each local
// parameter, every stored box that intersects its own, so any layout (TP, EP, ETP, DP) loads any other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/core/file.h"
#include "moecore/nn/parameter.h"

namespace moecore::ckpt {

// A parameter's place in its global tensor: the box [offset, offset + size) of the view `global`.
struct Box {
  Shape global, size;
  std::vector<int64_t> offset;
  int64_t volume() const { return size.numel(); }
};
Box box_of(const nn::Parameter& p);
// The whole of a tensor of shape s, as a box of itself.
Box whole_box(const Shape& s);

// Whether two boxes of the same global view share an element.
bool boxes_intersect(const Box& a, const Box& b);
// Copies the elements of `src` (holding box sb) that fall inside db into `dst` (holding box db); both boxes of the
// same global view, tensors of the same dtype. Returns the number of elements copied.
int64_t copy_intersection(const Tensor& src, const Box& sb, Tensor& dst, const Box& db);

struct ShardRecord {
  std::string name, file;
  Box box;
  DType dtype = DType::F32;
  uint64_t checksum = 0;  // XXH3-64 of the shard's bytes
};

// A tensor a rank stores: the box `box` of the global tensor `name` (model parameters, optimizer moments, buffers).
struct StoredTensor {
  std::string name;
  Box box;
  Tensor tensor;
};
StoredTensor stored(const nn::Parameter& p);

// Writes `tensors` (this rank's; each global element stored by exactly one rank) to
// dir/model_rank<rank>.safetensors and its index fragment dir/index_rank<rank>.json, both fsynced.
void write_shards(const std::string& dir, int64_t rank, const std::vector<StoredTensor>& tensors);
void write_model_shards(const std::string& dir, int64_t rank, const std::vector<const nn::Parameter*>& params);
// Merges the fragments of ranks [0, world) into dir/index.json after checking that every tensor's global view
// is tiled exactly once by consistent shards; otherwise throws listing every problem (missing or duplicated
// elements, with the indices along the first dimension, e.g. experts; inconsistent global shapes or dtypes).
void write_model_index(const std::string& dir, int64_t world);
// The validated shard list of a checkpoint directory.
std::vector<ShardRecord> read_model_index(const std::string& dir);

// A tensor to fill from a checkpoint: the box `box` of global tensor `name`, copied into *dst (same dtype or
// converted). vocab_rows > 0 marks dimension 0 as a padded vocabulary: the checkpoint may pad it differently
// (vocabulary padding depends on TP) as long as both hold the first vocab_rows rows; rows beyond the
// checkpoint's are left as they are.
struct LoadTarget {
  std::string name;
  Box box;
  Tensor* dst = nullptr;
  int64_t vocab_rows = 0;
};
// Fills every target from dir, whatever layout wrote it: checksums verified, shapes checked, every element found
// exactly once; otherwise throws listing every problem.
void load_tensors(const std::string& dir, const std::vector<LoadTarget>& targets);
// The same with the index already read (read_model_index), for callers loading tensor by tensor.
void load_tensors(const std::string& dir, const std::vector<ShardRecord>& records,
                  const std::vector<LoadTarget>& targets);
// load_tensors for every parameter of `reg`.
void load_model(const std::string& dir, nn::ParamRegistry& reg);

// Durable small files (core/file.h): written, fsynced, closed (the caller places them atomically by rename).
using moecore::fsync_dir;
using moecore::write_file_durable;

}  // namespace moecore::ckpt
