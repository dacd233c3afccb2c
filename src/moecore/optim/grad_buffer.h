// Megatron's parameter-and-gradient buffers (param_and_grad_buffer.py) for the parameters of one optimizer: the
// gradients laid end to end in contiguous f32 buckets, each parameter's `grad` a view into its bucket (Megatron's
// main_grad), so a bucket is reduced in place with no packed copy; for the sharded optimizer also the values, in a
// parameter buffer of their storage dtype (bf16-stored and f32 parameters in buckets of their own), so the updated
// shards are all-gathered straight into the parameters. Not the reductions themselves (grad_sync.h,
// distributed_optimizer.h).
#pragma once

#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/nn/parameter.h"

namespace moecore::optim {

// Maps a parameter to its layer bucket: its transformer layer, or num_layers for the embedding, final norm and
// output layer (their gradients are final last).
using BucketOf = std::function<size_t(const nn::Parameter&)>;

struct BufferBucket {
  std::vector<nn::Parameter*> params;  // laid end to end from offset 0, in this order
  std::vector<int64_t> offsets;        // each parameter's first element in the bucket
  int64_t numel = 0;                   // the parameters' elements
  int64_t padded = 0;                  // the buffers' elements: numel rounded up to a multiple of the shard count
  DType storage = DType::F32;          // the dtype of the parameters' values
  bool fp8 = false;                    // FP8 parameters (nn/fp8_param.h): f32 values, their f32 masters apart
  Tensor grad;                         // [padded] in the gradients' dtype (f32; f64 in checks)
  Tensor param;                        // [padded] in `storage`, with parameter buffers only
  std::vector<size_t> layers;          // the layer buckets whose gradients it holds
  size_t pending = 0;                  // of `layers`, those not yet reported final this step
  comm::Work work;
  bool started = false;
};

struct BufferLayout {
  size_t num_layers = 0;  // layer buckets 0..num_layers (see BucketOf)
  BucketOf bucket_of;
  // --ddp-bucket-size (elements; 0: one bucket per layer bucket): parameters are taken in the order their gradients
  // become final (layers from the last to the first, then the embedding and output layer) and a bucket is closed
  // at a parameter boundary once it holds at least this many elements.
  int64_t bucket_size = 0;
  int64_t shards = 1;          // each bucket padded to a multiple of this (the sharding group's size)
  bool param_buffers = false;  // values as views too, in buckets of one storage dtype each
  // Megatron FSDP's sharded initialisation: the buckets laid out (parameters, offsets, sizes) without their buffers,
  // the parameters left as they are (unallocated).
  bool layout_only = false;
  Device device = Device::cpu();  // where the buffers live (the parameters')
};

// The storage dtype a parameter takes in the optimizer's parameter buffers: bf16 where it is marked bf16_storage
// and computed in f32 (its f32 master then lives in the optimizer), else its own. FP8 parameters (f32 storage)
// are laid out in buckets of their own.
DType storage_dtype(const nn::Parameter& p);

// Lays `params` out in buckets and makes their gradients (zeroed) and, with param_buffers, their values (converted
// to the storage dtype) views into them.
std::vector<BufferBucket> make_buckets(const std::vector<nn::Parameter*>& params, const BufferLayout& layout);

// Layer `layer`'s gradients are final: the buckets it completes, in the order every rank starts them.
std::vector<size_t> complete_buckets(std::vector<BufferBucket>& buckets, size_t layer);
// Every bucket's pending count back to its number of layers (after a step's reductions finished).
void reset_pending(std::vector<BufferBucket>& buckets);

}  // namespace moecore::optim
