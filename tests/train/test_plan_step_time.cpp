// The step-time model of `moecore plan --plan-gpu` (train/plan/step_time.h): the pipeline simulation against the
// closed-form bubbles of 1F1B and interleaved 1F1B, and the whole model against Megatron-Bridge's published runs
// (plan only: flags in, prediction out). The rates are calibrated from microbenchmarks (docs/plan.md), never fitted
// to these runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "moecore/train/config/start_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/plan/layout_search.h"
#include "moecore/train/plan/step_time.h"

namespace moecore::train::plan {
namespace {

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// 1F1B with equal stages: (M + P - 1) (F + B).
TEST(PlanPipeline, OneFOneBBubbleIsPMinusOnePasses) {
  const int64_t P = 4, M = 8;
  const double F = 1.0, B = 2.0;
  const std::vector<std::vector<double>> fwd(P, {F}), bwd(P, {B});
  const std::vector<double> end = simulate_pipeline(M, P, 1, 0, fwd, bwd, 0.0);
  for (int64_t r = 0; r < P; r++) EXPECT_LE(end[r], (M + P - 1) * (F + B) + 1e-9);
  EXPECT_NEAR(end[0], (M + P - 1) * (F + B), 1e-9);
}

// Interleaved 1F1B with v chunks per rank of a stage's F/v and B/v: the bubble shrinks to (P - 1)(F + B)/v.
TEST(PlanPipeline, InterleavingDividesTheBubbleByTheChunks) {
  const int64_t P = 4, M = 8, V = 2;
  const double F = 1.0, B = 2.0;
  const std::vector<std::vector<double>> fwd(P, std::vector<double>(V, F / V)), bwd(P, std::vector<double>(V, B / V));
  const std::vector<double> end = simulate_pipeline(M, P, V, 0, fwd, bwd, 0.0);
  EXPECT_NEAR(end[0], M * (F + B) + (P - 1) * (F + B) / V, 1e-9);
}

// A P2P latency on every stage boundary adds to the bubble, never removes work.
TEST(PlanPipeline, LatencyOnlyLengthensTheStep) {
  const std::vector<std::vector<double>> fwd(4, {1.0}), bwd(4, {2.0});
  EXPECT_GT(simulate_pipeline(8, 4, 1, 0, fwd, bwd, 0.1)[0], simulate_pipeline(8, 4, 1, 0, fwd, bwd, 0.0)[0]);
}

StepPrediction predict(const std::vector<std::string>& flags, int64_t world, const std::string& gpu) {
  const TrainConfig c = compose_train_config(parse_flags(flags), true);
  const int64_t vocab = build_vocabulary(c).padded;
  return predict_step(c, vocab, PlanLayout::from(c, world), gpu_spec(gpu));
}

// Megatron-Bridge's model verification card for Qwen3-30B-A3B (examples/model_verification_cards/qwen3-30b-a3b,
// pretrain_performance.H100): recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config on 16 H100, 299.352 TFLOPS/GPU
// over steps 41-50. The recipe: TP 1, PP 1, EP 16, ETP 1, GBS 1024, MBS 1, sequence 4096, BF16, the distributed
// optimizer, no recompute, forced load balancing, the flex dispatcher with HybridEP,
// --overlap-moe-expert-parallel-comm without --delay-wgrad-compute (Megatron's combined 1F1B), gradients reduced
// in bf16 (grad_reduce_in_fp32 off), Bridge's default DDP overlaps.
std::vector<std::string> qwen3_30b_a3b_h100_recipe() {
  return words(
      "--num-layers 48 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 4 "
      "--kv-channels 128 --qk-layernorm --swiglu --disable-bias-linear --normalization RMSNorm "
      "--position-embedding-type rope --rotary-base 1000000 --untie-embeddings-and-output-weights --num-experts 128 "
      "--moe-router-topk 8 --moe-ffn-hidden-size 768 --ffn-hidden-size 6144 --vocab-size 151936 --seq-length 4096 "
      "--max-position-embeddings 40960 --hidden-dropout 0 --attention-dropout 0 --micro-batch-size 1 "
      "--global-batch-size 1024 --bf16 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
      "--expert-model-parallel-size 16 --expert-tensor-parallel-size 1 --use-distributed-optimizer "
      "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --overlap-moe-expert-parallel-comm "
      "--moe-router-force-load-balancing --moe-router-load-balancing-type aux_loss "
      "--moe-aux-loss-coeff 1e-3 --grad-reduce-in-bf16 --overlap-grad-reduce "
      "--overlap-param-gather --mock-data --train-iters 1");
}

// Megatron-Bridge's performance summary, 25.09 container, DGX-H100: DeepSeekV3 on 1,024 GPUs, GBS 8192, MBS 1,
// sequence 4096, TP 2, PP 8, CP 1, VP 4, EP 64: 338 TFLOPS/GPU with FP8 per-tensor current scaling, 330 with
// blockwise FP8. The recipe (perf_recipes/deepseek/h100/deepseek_v3.py, deepseek_v3_pretrain_1024gpu_h100_fp8cs):
// sequence parallel, layout "Et|(tt|)*30mL" with one MTP layer, recompute of mla_up_proj and mlp, forced load
// balancing, the flex dispatcher with DeepEP (the DeepSeek-V3 recipe's backend), gradients reduced in bf16,
// --overlap-grad-reduce off. Bridge also overlaps the parameter all-gather (with the optimizer step) without
// overlapping the gradient reduce, which Megatron-LM's flags refuse ("Must use --overlap-param-gather with
// --overlap-grad-reduce"): here the all-gather is exposed.
std::vector<std::string> deepseek_v3_h100_recipe(const std::string& fp8_recipe) {
  return words(
      "--model deepseek-v3-671b --mtp-num-layers 1 --tensor-model-parallel-size 2 --sequence-parallel "
      "--pipeline-model-parallel-size 8 --pipeline-model-parallel-layout Et|(tt|)*30mL --expert-model-parallel-size "
      "64 --expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 8192 --bf16 --fp8-format hybrid "
      "--fp8-recipe " +
      fp8_recipe +
      " --use-distributed-optimizer --recompute-granularity selective --recompute-modules mla_up_proj mlp "
      "--moe-router-force-load-balancing --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep "
      "--grad-reduce-in-bf16 --mock-data --train-iters 1");
}

// The model misses this run by more than the quarter: it predicts 1.30x the published 299.4 TFLOPS
// (docs/plan.md, "Checked against published runs": about 5.5 s a step the EP overlap does not hide, slower exchanges
// or host time around HybridEP's synchronizations). The rates are not fitted to close the gap; this test holds the
// prediction where it is (optimistic, within 60% of the published figure) so that a change to the model shows.
TEST(PlanPublished, Qwen3_30B_A3B_On16H100OptimisticWithinSixtyPercent) {
  const StepPrediction p = predict(qwen3_30b_a3b_h100_recipe(), 16, "h100");
  RecordProperty("predicted_tflops", std::to_string(p.tflops_per_gpu));
  EXPECT_GT(p.tflops_per_gpu / 299.352, 1.0) << describe(p, gpu_spec("h100"), 16);
  EXPECT_LT(p.tflops_per_gpu / 299.352, 1.6) << describe(p, gpu_spec("h100"), 16);
}

// Megatron-Bridge's MoE playbook (skills/nemo-mbridge-perf-moe-hardware-configs/card.yaml, qwen3_30b_h100_16
// .earlier_overlap_ab) measured the EP overlap on this shape in a matched A/B: 244.039 TFLOPS per GPU without it,
// 287.305 with it (+17.7%). The model's gain from --overlap-moe-expert-parallel-comm is within 10 points of that
// (it predicts +24.2%; the overlap saves 3.72 s a step in the run, 3.75 s in the model), though both of its
// predictions are about 1.3x optimistic (docs/plan.md).
TEST(PlanPublished, Qwen3_30B_A3B_EpOverlapGainNearTheMeasuredAB) {
  std::vector<std::string> without = qwen3_30b_a3b_h100_recipe();
  without.erase(std::find(without.begin(), without.end(), "--overlap-moe-expert-parallel-comm"));
  const double on = predict(qwen3_30b_a3b_h100_recipe(), 16, "h100").tflops_per_gpu;
  const double off = predict(without, 16, "h100").tflops_per_gpu;
  const double measured_gain = 287.305 / 244.039 - 1;
  EXPECT_GT(on / off - 1, 0.0);
  EXPECT_NEAR(on / off - 1, measured_gain, 0.10) << "predicted " << off << " without, " << on << " with the overlap";
}

// Host synchronizations are counted (not priced) as Megatron's dispatchers make them: HybridEP without a token
// budget reads its counts back once per MoE layer forward and micro-batch (48 layers x 64 micro-batches), a full
// recompute's second forward reads them again, drop-and-pad fixes them on the host (none), and the alltoall
// dispatcher syncs as HybridEP does. The printed plan names them.
TEST(PlanOps, HostSyncsCountedPerMoeForward) {
  // The recipe without the flag `drop` (and its value when `drop_words` is 2), with `extra` added.
  auto with = [](const std::string& extra, const std::string& drop = "", int drop_words = 2) {
    std::vector<std::string> f = qwen3_30b_a3b_h100_recipe();
    if (!drop.empty()) f.erase(std::find(f.begin(), f.end(), drop), std::find(f.begin(), f.end(), drop) + drop_words);
    for (const std::string& w : words(extra)) f.push_back(w);
    return predict(f, 16, "h100").host_syncs;
  };
  EXPECT_EQ(with(""), 48 * 64);
  // Megatron refuses recomputing the MoE layer with the EP overlap.
  const std::string overlap = "--overlap-moe-expert-parallel-comm";
  EXPECT_EQ(with("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", overlap, 1),
            2 * 48 * 64);
  EXPECT_EQ(with("--recompute-granularity selective --recompute-modules moe", overlap, 1), 2 * 48 * 64);
  EXPECT_EQ(with("--recompute-granularity selective --recompute-modules moe_act", overlap, 1), 48 * 64);
  EXPECT_EQ(with("--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity"), 0);
  EXPECT_EQ(with("--moe-token-dispatcher-type alltoall", "--moe-token-dispatcher-type"), 48 * 64);
  const StepPrediction p = predict(qwen3_30b_a3b_h100_recipe(), 16, "h100");
  EXPECT_NE(describe(p, gpu_spec("h100"), 16).find("3072 host-GPU synchronizations"), std::string::npos);
}

TEST(PlanPublished, DeepSeekV3On1024H100Fp8CurrentScalingWithinAQuarter) {
  const StepPrediction p = predict(deepseek_v3_h100_recipe("tensorwise"), 1024, "h100");
  EXPECT_NEAR(p.tflops_per_gpu / 338.0, 1.0, 0.25) << describe(p, gpu_spec("h100"), 1024);
}

TEST(PlanPublished, DeepSeekV3On1024H100Fp8BlockwiseWithinAQuarter) {
  const StepPrediction p = predict(deepseek_v3_h100_recipe("blockwise"), 1024, "h100");
  EXPECT_NEAR(p.tflops_per_gpu / 330.0, 1.0, 0.25) << describe(p, gpu_spec("h100"), 1024);
}

// A small dense run (no experts) under TP 2 with sequence parallelism, one pipeline stage, no data parallelism: its
// only communication is TP's.
std::vector<std::string> dense_tp2(int64_t layers) {
  return words("--num-layers " + std::to_string(layers) +
               " --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 16 --swiglu --disable-bias-linear "
               "--normalization RMSNorm --position-embedding-type rope --seq-length 1024 --micro-batch-size 1 "
               "--global-batch-size 4 --vocab-size 32000 --bf16 --tensor-model-parallel-size 2 --sequence-parallel "
               "--mock-data --train-iters 1");
}

StepPrediction predict_on(const std::vector<std::string>& flags, int64_t world, const GpuSpec& gpu) {
  const TrainConfig c = compose_train_config(parse_flags(flags), true);
  return predict_step(c, build_vocabulary(c).padded, PlanLayout::from(c, world), gpu);
}

// Each collective pays the latency once: per micro-batch 4 per layer and direction (a gather and a scatter around
// attention and MLP), the ends' 2 per direction and the cross-entropy's 3 all-reduces: M (8 L + 7) calls.
TEST(PlanComm, CollectiveLatencyIsPaidOncePerCall) {
  GpuSpec fast = gpu_spec("h100");
  fast.collective_latency_nvlink = fast.collective_latency_network = 0;
  GpuSpec slow = fast;
  slow.collective_latency_nvlink = slow.collective_latency_network = 1e-3;
  for (int64_t L : {2, 3}) {
    const double d = predict_on(dense_tp2(L), 2, slow).step_seconds - predict_on(dense_tp2(L), 2, fast).step_seconds;
    EXPECT_NEAR(d, 4 * (8 * L + 7) * 1e-3, 1e-9) << L << " layers";
  }
}

// Megatron FSDP (optim_grads_params) adds only communication: with free links it predicts the distributed
// optimizer's step; across nodes (DP 16 over two 8-GPU domains) its per-micro-batch gathers make it slower.
TEST(PlanComm, FsdpAddsOnlyItsGathersAndScatters) {
  auto run = [](bool fsdp) {
    std::vector<std::string> f = words(
        "--num-layers 4 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 16 --swiglu "
        "--disable-bias-linear --normalization RMSNorm --position-embedding-type rope --seq-length 2048 "
        "--micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 --use-distributed-optimizer "
        "--mock-data --train-iters 1");
    if (fsdp) f.insert(f.end(), {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"});
    return f;
  };
  GpuSpec free_links = gpu_spec("h100");
  free_links.nccl_busbw_nvlink = free_links.nccl_busbw_network = free_links.alltoall_busbw_network = 1e30;
  free_links.collective_latency_nvlink = free_links.collective_latency_network = 0;
  free_links.comm_sms = 0;
  EXPECT_NEAR(predict_on(run(true), 16, free_links).step_seconds, predict_on(run(false), 16, free_links).step_seconds,
              1e-12);
  const StepPrediction fsdp = predict_on(run(true), 16, gpu_spec("h100")),
                       dist = predict_on(run(false), 16, gpu_spec("h100"));
  EXPECT_GT(fsdp.step_seconds, dist.step_seconds);
}

// Every kernel pays a launch: per micro-batch and layer of the dense TP run the 4 GEMMs (twice as many backward:
// 12) and the 8 other kernels (attention 5, MLP 3; backward twice: 24), the ends' output GEMM (3), embedding (3)
// and final norm with loss (4): M (36 L + 10) launches, of which M (24 L + 7) in the "kernel launches" class.
TEST(PlanOps, EveryKernelPaysOneLaunch) {
  GpuSpec none = gpu_spec("h100");
  none.kernel_launch_seconds = 0;
  GpuSpec slow = none;
  slow.kernel_launch_seconds = 1e-3;
  const double M = 4;  // global batch 4, micro-batch 1, DP 1
  for (int64_t L : {2, 3}) {
    const StepPrediction a = predict_on(dense_tp2(L), 2, slow), b = predict_on(dense_tp2(L), 2, none);
    EXPECT_NEAR(a.step_seconds - b.step_seconds, M * (36 * L + 10) * 1e-3, 1e-9) << L << " layers";
    double launches = 0;
    for (const auto& [name, t] : a.compute)
      if (name == "kernel launches") launches = t;
    EXPECT_NEAR(launches, M * (24 * L + 7) * 1e-3, 1e-9) << L << " layers";
  }
}

// Activation offloading adds only host copies, each direction beside its pass's compute: over a free host link
// the step is the one without offloading; over a slow one the copies (both ways, every micro-batch, the memory
// plan's offloaded bytes) are exposed and lengthen the step by exactly what the breakdown shows.
TEST(PlanOffload, HostCopiesAreHiddenOrExposed) {
  auto config = [](bool offload) {
    std::vector<std::string> f = words(
        "--num-layers 4 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 16 --swiglu "
        "--disable-bias-linear --normalization RMSNorm --position-embedding-type rope --seq-length 2048 "
        "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16 --mock-data --train-iters 1");
    if (offload)
      f.insert(f.end(), {"--fine-grained-activation-offloading", "--offload-modules", "core_attn", "attn_proj"});
    TrainConfig c = compose_train_config(parse_flags(f), true);
    c.device = "cuda";  // offloading applies on a GPU (the CPU keeps its stashes in host memory already)
    return c;
  };
  const TrainConfig on = config(true), off = config(false);
  const int64_t vocab = build_vocabulary(on).padded;
  const PlanLayout l = PlanLayout::from(on, 1);
  GpuSpec g = gpu_spec("h100");
  g.host_bandwidth = 1e30;
  EXPECT_NEAR(predict_step(on, vocab, l, g).step_seconds, predict_step(off, vocab, l, g).step_seconds, 1e-12);
  g.host_bandwidth = 1e6;  // 1 MB/s: the copies dwarf the compute
  const StepPrediction slow = predict_step(on, vocab, l, g), base = predict_step(off, vocab, l, g);
  double exposed = 0;
  for (const auto& [name, t] : slow.exposed_comm)
    if (name == "offload (host)") exposed = t;
  EXPECT_NEAR(slow.step_seconds - base.step_seconds, exposed, 1e-9);
  const double bytes = plan_memory_stages(on, vocab, l).front().offloaded;
  ASSERT_GT(bytes, 0);
  EXPECT_NEAR(exposed / (2 * 8 * bytes / 1e6), 1.0, 1e-3);
}

// --search tries offloading for a layout that does not fit without it: with a limit between the run's plan with
// every module offloaded and its plan without, that layout is found (with its offloading flags) and counted.
TEST(PlanOffload, SearchTriesOffloadingWhereALayoutDoesNotFit) {
  const std::string run =
      "--num-layers 4 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 16 --swiglu "
      "--disable-bias-linear --normalization RMSNorm --position-embedding-type rope --seq-length 4096 "
      "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16 --mock-data --train-iters 1";
  auto memory = [](const std::string& flags) {
    TrainConfig c = compose_train_config(parse_flags(words(flags)), true);
    c.device = "cuda";
    return worst_stage(plan_memory_stages(c, build_vocabulary(c).padded, PlanLayout::from(c, 1))).total();
  };
  const double plain = memory(run), offloaded = memory(run +
                                                       " --fine-grained-activation-offloading --offload-modules "
                                                       "attn_norm qkv_linear core_attn attn_proj mlp_norm");
  ASSERT_LT(offloaded, plain);
  const SearchResult r = search_layouts(words(run), 1, (plain + offloaded) / 2, gpu_spec("h100"), {}, 100);
  EXPECT_GT(r.offloaded, 0);
  bool listed = false;
  for (const Candidate& k : r.best)
    if (std::find(k.flags.begin(), k.flags.end(), "--fine-grained-activation-offloading") != k.flags.end())
      listed = listed || std::find(k.flags.begin(), k.flags.end(), "--recompute-granularity") == k.flags.end();
  EXPECT_TRUE(listed) << "the layout without recompute fits only offloaded";
}

// Faster GPUs, same run: never slower; a GPU twice as fast in every figure but the network is not twice as fast.
TEST(PlanPublished, FasterGpusPredictShorterSteps) {
  const double h100 = predict(qwen3_30b_a3b_h100_recipe(), 16, "h100").step_seconds;
  const double h200 = predict(qwen3_30b_a3b_h100_recipe(), 16, "h200").step_seconds;
  const double b200 = predict(qwen3_30b_a3b_h100_recipe(), 16, "b200").step_seconds;
  EXPECT_LE(h200, h100);
  EXPECT_LT(b200, h200);
  EXPECT_GT(b200, h100 / 2.6);
}

}  // namespace
}  // namespace moecore::train::plan
