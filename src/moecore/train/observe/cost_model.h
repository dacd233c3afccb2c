// Analytic costs of one training step from the model's sizes and the layout alone: the model FLOPs (as Megatron
// counts them for MoE; what MFU divides) and the bytes each process group must carry under bandwidth-optimal
// collectives (what `moecore bench comm` compares the measured traffic with). No measurement here.
#pragma once

#include <map>
#include <string>

#include "moecore/nn/parameter.h"
#include "moecore/train/config/config.h"
#include "moecore/train/parallel_groups.h"

namespace moecore::train {

// Model FLOPs of one training step (forward + backward) over the global batch.
double step_flops(const TrainConfig& c, int64_t padded_vocab);

// Megatron's num_floating_point_operations (training.py, transformer_flops, the BSHD path) for one global batch,
// written in its own terms: what --log-throughput divides by the time and the world size. Equal to step_flops
// (tests/train/test_logging.cpp checks both against a hand count); kept separate so that a change to one is caught.
double num_floating_point_operations(const TrainConfig& c, int64_t padded_vocab);

// Bytes this rank must receive per training step on each named group ("tp", "dp", "edp", "ep", "etp") with
// routing taken as uniform; empty for a single process.
std::map<std::string, double> analytic_comm_bytes(const TrainConfig& c, const nn::ParamRegistry& reg,
                                                  const ParallelGroups& g);

// The same from the groups' sizes and this rank's parameters alone (what `moecore plan` knows before anything is
// built): elements and stored bytes of the dense, replicated (not tensor-parallel) and expert parameters.
// activation_bytes and grad_bytes: a value of an activation and of a gradient on the wire (moecore: f32; a GPU plan
// of Megatron under --bf16 without --grad-reduce-in-fp32-style options: 2).
struct CommSizes {
  int64_t tp = 1, dp = 1, ep = 1, etp = 1, edp = 1, num_microbatches = 1;
  double n_dense = 0, n_rep = 0, n_exp = 0, w_dense = 0, w_exp = 0;
  double activation_bytes = 4, grad_bytes = 4;
};
std::map<std::string, double> analytic_comm_bytes(const TrainConfig& c, const CommSizes& sizes);

}  // namespace moecore::train
