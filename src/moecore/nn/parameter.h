// Parameters and their registry: every trainable tensor has a global name, a shape, a dtype, a gradient and an
// init rule. Initialization draws element i of parameter `name` from Philox(seed, stream_id(name), i), so the
// value never depends on how the parameter is later sharded (DESIGN contract 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::nn {

enum class InitKind { Normal, Zeros, Ones };

struct InitRule {
  InitKind kind = InitKind::Normal;
  double std = 0.02;
  static InitRule normal(double std) { return {InitKind::Normal, std}; }
  static InitRule zeros() { return {InitKind::Zeros, 0.0}; }
  static InitRule ones() { return {InitKind::Ones, 0.0}; }
};

struct Parameter {
  std::string name;
  Tensor value;  // master copy: f32 (or f64 in gradient checks)
  Tensor grad;   // same shape and dtype; backward accumulates into it
  InitRule init;
  bool no_weight_decay = false;  // norms, biases (Megatron's default exclusions)
  // A shard of a larger global parameter (expert parallelism): its first element's index in the global tensor,
  // so initialization draws the global tensor's values. Expert shards reduce gradients over the expert-data-
  // parallel group and count in the grad norm once per expert-parallel group.
  int64_t global_offset = 0;
  bool expert_parallel = false;
};

class ParamRegistry {
 public:
  explicit ParamRegistry(DType dtype = DType::F32);
  DType dtype() const { return dtype_; }

  // Registers a parameter; names must be unique.
  Parameter& add(const std::string& name, const Shape& shape, InitRule init, bool no_weight_decay = false);
  Parameter& get(const std::string& name);
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  int64_t numel() const;

  void initialize(uint64_t seed);
  void zero_grad();

 private:
  DType dtype_;
  std::vector<std::unique_ptr<Parameter>> params_;
};

// Fills `t` with init values for the global elements [offset, offset + t.numel()) of parameter `name`.
void init_tensor(Tensor& t, const std::string& name, InitRule rule, uint64_t seed, int64_t offset = 0);

}  // namespace moecore::nn
