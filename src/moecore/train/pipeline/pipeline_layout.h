// Which decoder layers, and whether the embedding, the loss and the MTP layers, each pipeline stage holds: Megatron's
// even split, uneven first/last stages, --account-for-embedding/loss-in-pipeline-split, virtual stages and the
// --pipeline-model-parallel-layout string, with every one of Megatron's argument checks on them. Pure (no MPI, no
// model): the pipeline schedules and the model builder consume the plan; they are not here.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moecore::train {

struct TrainConfig;

// One (pipeline rank, virtual stage) model chunk: decoder layers [first_layer, first_layer + num_layers), global and
// 0-based; the embedding on the pipeline's first stage, the loss (output layer) on its last, as Megatron's
// pre_process / post_process place them; MTP layers where the layout puts them (the last stage by default).
struct StageLayers {
  int64_t first_layer = 0, num_layers = 0;
  bool embedding = false, loss = false;
  int64_t mtp_layers = 0;
};

struct PipelineLayout {
  int64_t pp = 1, vpp = 1;
  std::vector<StageLayers> stages;  // index = virtual_stage * pp + pp_rank (Megatron's model-chunk order)

  const StageLayers& at(int64_t pp_rank, int64_t vstage) const;
  int64_t num_stages() const { return pp * vpp; }
  bool interleaved() const { return vpp > 1; }  // Megatron's interleaved 1F1B schedule
  int64_t num_layers() const;                   // decoder layers over all stages
  // The (pp_rank, vstage) holding decoder layer `layer` (0-based).
  std::pair<int64_t, int64_t> stage_of_layer(int64_t layer) const;
  // Human table of the plan: one row per pipeline rank, one column per virtual stage.
  std::string describe() const;
};

// The flags plan_pipeline reads (-1: unset where Megatron has None; "" for no layout string).
struct PipelineFlags {
  int64_t num_layers = 1;                          // --num-layers
  int64_t pp = 1;                                  // --pipeline-model-parallel-size
  int64_t num_layers_per_virtual_stage = -1;       // --num-layers-per-virtual-pipeline-stage
  int64_t num_virtual_stages_per_rank = -1;        // --num-virtual-stages-per-pipeline-rank
  int64_t decoder_first_pipeline_num_layers = -1;  // --decoder-first-pipeline-num-layers
  int64_t decoder_last_pipeline_num_layers = -1;   // --decoder-last-pipeline-num-layers
  bool account_for_embedding = false;              // --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;                   // --account-for-loss-in-pipeline-split
  std::string layout;                              // --pipeline-model-parallel-layout
  int64_t mtp_num_layers = 0;                      // --mtp-num-layers (refused in moecore today: 0)
  bool overlap_p2p_comm = true;                    // false: --no-overlap-p2p-communication (interleaving needs PP > 2)
};

PipelineFlags pipeline_flags(const TrainConfig& c);

// The stage of every layer, exactly as Megatron assigns them (get_num_layers_to_build, get_transformer_layer_offset,
// PipelineParallelLayerLayout). Throws Error, before any work, for every combination Megatron refuses (naming the
// flags, their values and what would fit; a layout string that does not fit the model is shown parsed), and for
// the few Megatron accepts but builds without every layer exactly once.
PipelineLayout plan_pipeline(const PipelineFlags& f);

// Megatron's interleaved schedule's rules on the micro-batches of one step on one data-parallel rank
// (--global-batch-size / (--micro-batch-size x DP)): with virtual stages, the group of micro-batches run per virtual
// stage (microbatch_group_size_per_vp_stage; 0: Megatron's default, PP) must lie in [PP, M], and M modulo it must
// be 0 or at least PP; with the default, M must be a multiple of PP. 1F1B and no pipelining take any M >= 1.
void check_pipeline_microbatches(const PipelineLayout& layout, int64_t num_microbatches,
                                 int64_t microbatch_group_size = 0);

// The layout string expanded as Megatron's parse_str_to_list does (commas dropped, "(...)*n" then "x*n" unrolled,
// split at '|'): one string of layer characters (E, t, m, L) per stage, in model-chunk order. Throws Error naming
// the first character that is not one of them.
std::vector<std::string> parse_pipeline_layout(const std::string& layout);

}  // namespace moecore::train
