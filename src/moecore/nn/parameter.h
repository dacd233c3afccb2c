// Parameters and their registry: every trainable tensor has a global name, a shape, a dtype, a gradient and an
// init rule. Initialization draws element i of parameter `name` from Philox(seed, stream_id(name), i), so the
// value never depends on how the parameter is later sharded (DESIGN contract 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/gemm.h"

namespace moecore::nn {

class Fp8Param;  // fp8_param.h

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
  // The weights the model computes with: f32 (or f64 in gradient checks), or bf16/f16 where low_storage says so and an
  // optimizer keeps the f32 master (Megatron's bf16 parameters beside fp32 main parameters in the optimizer).
  Tensor value;
  Tensor grad;  // same shape, f32 (or f64); backward accumulates into it (see grad_stale)
  InitRule init;
  bool no_weight_decay = false;  // norms, biases (Megatron's default exclusions)
  // Set at registration by a module whose math reads this parameter only through low_weights / packed_bf16_weight
  // (its GEMMs run in bf16 or f16): an optimizer then keeps the f32 master weights itself and the model holds `value`
  // in that dtype, the master rounded, as Megatron's --bf16 and --fp16 hold their parameters. Parameters read in f32
  // anywhere (norms, biases, router, embeddings, a tied output layer) are never marked and stay f32.
  LowPrecision low_storage{};
  // --fp8-param-gather, at an FP8 GEMM site: `value` (f32) holds the FP8 weight read back, cast from the f32 master
  // the optimizer keeps (fp8_param.h); null elsewhere.
  std::shared_ptr<Fp8Param> fp8;
  // The dtype the math computes this parameter's products and gradients in (f32, or f64 in checks), whatever the
  // storage of `value`.
  DType math_dtype() const { return grad.dtype(); }
  // A shard of a larger global parameter: this tensor is the box [box_offset, box_offset + box_shape) of the
  // global tensor seen as `global_view`, a row-major view that may split a dimension (a SwiGLU fc1 [2F, H] seen as
  // [2, F, H], so a tensor-parallel shard takes matching gate and up rows). Initialization draws the global
  // tensor's values; checkpoints place the shard by it. Empty global_view: the parameter is the whole tensor.
  Shape global_view, box_shape;
  std::vector<int64_t> box_offset;
  // Expert shards reduce gradients over the expert-data-parallel group; tensor-parallel shards differ across the
  // TP (or ETP) ranks. A parameter that is neither is replicated over TP: under sequence parallelism each TP rank
  // holds a partial gradient (its tokens), summed over TP (Megatron's `sequence_parallel` parameters).
  bool expert_parallel = false;
  bool tensor_parallel = false;

  // The bf16 (f16) copy of an f32 `value` that bf16 (f16) GEMMs read, cached only inside a Bf16WeightScope (below).
  Tensor low_cache;
  bool low_cache_valid = false, low_cache_enabled = false;
  // Set by the optimizer where its update also wrote low_cache (the new value rounded; bf16 copies only): the next
  // Bf16WeightScope takes the copy as it is, after checking sampled elements against `value`, instead of rounding
  // value again.
  bool low_cache_from_update = false;
  // Packed copies of 2-D slices of low_cache (kernels::PackedWeight), made at most once per Bf16WeightScope that
  // packs: slot slice·2 + trans (see packed_bf16_weight). The buffers stay for the next step, as low_cache does.
  std::vector<kernels::PackedWeight> packed_cache;
  std::vector<bool> packed_valid;
  bool pack_enabled = false;

  // Set by a lazy ParamRegistry::zero_grad instead of zeroing: grad's contents are last step's and count as zero.
  // The step's first writer overwrites them (a weight-gradient GEMM with beta 0: neither a zeroing pass nor a read
  // of zeros) or zeroes them first (writers that add element by element); whatever reads gradients settles first.
  bool grad_stale = false;
  // The beta of a GEMM accumulating into the whole of grad: 0 while it is stale (it overwrites), 1 after.
  float take_grad_beta() {
    const bool stale = grad_stale;
    grad_stale = false;
    return stale ? 0.0f : 1.0f;
  }
  // grad, zeroed first where stale: for writers that add into it.
  Tensor& grad_to_add() {
    settle_grad();
    return grad;
  }
  void settle_grad() {
    if (grad_stale && grad.defined()) grad.zero_();  // an unallocated one (a freed FSDP unit's) stays to its owner
    grad_stale = grad_stale && !grad.defined();
  }

  bool sharded() const { return global_view.ndim() > 0; }
  // Declares this parameter the box of a global view (see above); box_shape.numel() must equal value.numel().
  void set_shard(const Shape& global, const std::vector<int64_t>& offset, const Shape& box);
  // Global row-major index of each local element's position, for element i of the local tensor.
  int64_t global_index(int64_t i) const;
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
  // Megatron's --init-model-with-meta-device: the parameters registered from now on hold their shape and dtype but
  // no storage (Tensor::unallocated); initialize skips them, and the optimizer that shards them allocates and
  // initialises only this rank's shards (init_parameter_range), so no rank ever holds the whole model.
  void set_meta(bool meta) { meta_ = meta; }
  // Zeroes every gradient; `lazy` (host tensors only) marks them stale instead (Parameter::grad_stale), for a
  // training step whose writers overwrite them and whose readers settle them first (settle_grads).
  void zero_grad(bool lazy = false);
  // Zeroes the gradients still stale: those no backward wrote this step.
  void settle_grads();
  // Tests: how a lazy zero_grad behaves. Poisoned fills the stale gradients with NaN, so a writer that adds into one,
  // or a reader that reads one unsettled, turns the step's numbers into NaN; Eager zeroes them as zero_grad() does.
  enum class LazyZero { Lazy, Poisoned, Eager };
  static void set_lazy_zero(LazyZero mode);
  // Moves every value and gradient to `d` (initialization draws on the host; a model then moves as a whole), before
  // an optimizer takes the parameters: its buckets then hold the gradients (and values) they are views of.
  void to(Device d);
  Device device() const { return device_; }

 private:
  DType dtype_;
  bool meta_ = false;
  Device device_ = Device::cpu();
  std::vector<std::unique_ptr<Parameter>> params_;
};

// Within one training step's micro-batches no weight changes, so an f32 weight a bf16 GEMM reads (one not stored in
// bf16: a tied output layer's, or any where no optimizer keeps masters) is rounded once per step instead of once per
// micro-batch: a Bf16WeightScope over the registry makes bf16_weights() cache the copy in the
// parameter until the scope ends. Outside a scope every call rounds afresh (a weight may have changed). Where the
// optimizer's update wrote the copy (Parameter::low_cache_from_update) the scope starts with it: 64 elements spread
// over the tensor are compared with value first, and any difference (value written by something else since, e.g. a
// checkpoint load) makes it round value again.
// With `pack` (kernels::pack_weights_for the step's micro-batches) the experts' weights are also packed once.
class Bf16WeightScope {
 public:
  explicit Bf16WeightScope(ParamRegistry& reg, bool pack = false);
  ~Bf16WeightScope();
  Bf16WeightScope(const Bf16WeightScope&) = delete;
  Bf16WeightScope& operator=(const Bf16WeightScope&) = delete;

 private:
  ParamRegistry& reg_;
};
// p.value rounded to `low` (bf16 or f16; see Bf16WeightScope); a value stored in `low` is itself.
Tensor low_weights(Parameter& p, DType low);
// The bf16 matrix w_bf16 (slice `slice` of low_weights(p), as op(W) with `trans`) packed for products of about m
// rows (kernels::pack_weight), once per Bf16WeightScope that packs; elsewhere w_bf16 unpacked. Same bits either way.
kernels::PackedWeight packed_bf16_weight(Parameter& p, const Tensor& w_bf16, int64_t slice, bool trans, int64_t m);

// Gradients of `params` laid end to end from the start of `flat` (f32), and back: the flat buffers collectives
// reduce.
void pack_grads(const std::vector<Parameter*>& params, Tensor& flat);
void unpack_grads(const Tensor& flat, const std::vector<Parameter*>& params);

// Fills `t` with init values for the global elements [offset, offset + t.numel()) of parameter `name`.
void init_tensor(Tensor& t, const std::string& name, InitRule rule, uint64_t seed, int64_t offset = 0);
// Fills p.value with its init values: the global tensor's elements at the shard's positions.
void init_parameter(Parameter& p, uint64_t seed);
// Fills `out` (f32 or f64) with the init values of p's local elements [first, first + out.numel()): the elements
// init_parameter would write there, for a rank that holds only part of p.
void init_parameter_range(const Parameter& p, uint64_t seed, int64_t first, Tensor& out);

}  // namespace moecore::nn
