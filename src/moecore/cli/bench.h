// `moecore bench ...`: microbenchmarks that print achieved figures and their ratio to a roofline measured in the
// same run (the GEMM peak), because absolute times drift on shared machines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/core/dtype.h"

namespace moecore::cli {

struct GemmBenchResult {
  double gflops_best = 0;
  double gflops_median = 0;
};

// Square GEMM M=N=K=size with operands of `dtype` (f32 or bf16), `iters` timed runs after one warm-up.
GemmBenchResult bench_gemm(DType dtype, int64_t size, int iters);

// The roofline other benchmarks divide by: the best rate of square GEMMs of sizes 1024 and 2048 with operands of
// `dtype`, measured now. The best over shapes keeps ratios honest (never flattered by a shape the GEMM library
// handles badly); smaller sizes are left out because their operands stay in L2, which training GEMMs never do
// (with AMX, 512³ bf16 reaches 2-3x the out-of-cache rate).
double gemm_peak(DType dtype);

struct AttentionBenchArgs {
  int64_t seq = 2048, batch = 1, heads = 8, kv_heads = 2, head_dim = 64;
  int iters = 3;
  std::string dtype = "f32";
};
void run_bench_attention(const AttentionBenchArgs& a);

struct MoEBenchArgs {
  int64_t tokens = 4096, hidden = 1024, ffn = 512, experts = 16, topk = 4;
  std::string dtype = "f32";
  int iters = 3;
  bool force_balance = false;
};
void run_bench_moe_layer(const MoEBenchArgs& a);

// Training throughput of a small MoE GPT on --mock-data: tokens/s, model-FLOP utilization against the same-run
// GEMM peak, peak memory. Extra arguments are `moecore train` flags that override the benchmark's model. Under
// mpirun the ranks train together in the layout the flags give, and the step time is split into compute and
// exposed communication (time blocked in collectives).
struct TrainBenchArgs {
  std::string dtype = "bf16";
  int iters = 4;
  std::vector<std::string> train_flags;
};
void run_bench_train(const TrainBenchArgs& a);

// Communication of a training step under mpirun (a small MoE model by default, routing forced uniform): for
// every group and collective, calls and bytes received per rank per step, the analytic minimum for the layout
// per group and the ratio; step time split into compute and exposed communication.
void run_bench_comm(const TrainBenchArgs& a);

// Checkpoint save and load throughput (GB/s) of a small MoE model's full training state (weights and Adam
// moments), each against a plain sequential write (+ fsync) and read of the same bytes in one file in the same
// directory and run. Extra arguments are `moecore train` flags overriding the model.
struct CheckpointBenchArgs {
  std::string dir = "/tmp/moecore_bench_checkpoint";
  int iters = 3;
  std::vector<std::string> train_flags;
};
void run_bench_checkpoint(const CheckpointBenchArgs& a);

// Tokenizer encode throughput on one thread and on `workers` threads (each encoding its share of documents).
// Input: a text file, or by default the English fortunes shipped by Debian.
void run_bench_tokenizer(const std::string& tokenizer_json, const std::string& input, int workers);
void run_bench_gemm(int64_t size, int iters);

}  // namespace moecore::cli
