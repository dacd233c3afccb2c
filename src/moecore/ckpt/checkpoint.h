// The native checkpoint's model state, layout-free: every rank writes the parameter shards it is responsible for
// into its own safetensors file, with an index fragment recording for each shard its global name, the global
// view it is a box of (Parameter::set_shard), the box, the dtype and a CRC-32 of its bytes. The fragments are
// merged into index.json only after every name is checked to be tiled exactly once. Loading reads, for each
// local parameter, every stored box that intersects its own, so any layout (TP, EP, ETP, DP) loads any other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/nn/parameter.h"

namespace moecore::ckpt {

// A parameter's place in its global tensor: the box [offset, offset + size) of the view `global`.
struct Box {
  Shape global, size;
  std::vector<int64_t> offset;
  int64_t volume() const { return size.numel(); }
};
Box box_of(const nn::Parameter& p);

// Copies the elements of `src` (holding box sb) that fall inside db into `dst` (holding box db); both boxes of the
// same global view, tensors of the same dtype. Returns the number of elements copied.
int64_t copy_intersection(const Tensor& src, const Box& sb, Tensor& dst, const Box& db);

struct ShardRecord {
  std::string name, file;
  Box box;
  DType dtype = DType::F32;
  uint32_t crc32 = 0;
};

// Writes `params` (the shards this rank stores; each global name at most once) to
// dir/model_rank<rank>.safetensors and its index fragment dir/index_rank<rank>.json.
void write_model_shards(const std::string& dir, int64_t rank, const std::vector<const nn::Parameter*>& params);
// Merges the fragments of ranks [0, world) into dir/index.json after checking that every parameter's global view
// is tiled exactly once by consistent shards; otherwise throws listing every problem (missing or duplicated
// elements, with the indices along the first dimension, e.g. experts; inconsistent global shapes or dtypes).
void write_model_index(const std::string& dir, int64_t world);
// The validated shard list of a checkpoint directory.
std::vector<ShardRecord> read_model_index(const std::string& dir);
// Loads every parameter of `reg` from dir, whatever layout wrote it: checksums verified, shapes checked, every
// element of every parameter found exactly once.
void load_model(const std::string& dir, nn::ParamRegistry& reg);

}  // namespace moecore::ckpt
