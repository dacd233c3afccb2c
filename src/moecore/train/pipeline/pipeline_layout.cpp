// plan_pipeline: Megatron's pipeline-split argument checks (arguments.py, then TransformerConfig, then the asserts of
// get_num_layers_to_build) in their order, then each stage's layers by get_num_layers_to_build and
// get_transformer_layer_offset, checked to hold every layer once. The layout string: pipeline_layout_string.cpp.
#include "moecore/train/pipeline/pipeline_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

// pipeline_layout_string.cpp
PipelineLayout plan_from_layout_string(const PipelineFlags& f, const std::vector<std::string>& parsed);
std::string stage_table(int64_t pp, int64_t vpp, const std::vector<std::string>& cells);

namespace {

constexpr int64_t kMaxStages = int64_t{1} << 20;

// Python's // and % (floor), which Megatron's formulas use; b != 0.
int64_t floordiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int64_t pymod(int64_t a, int64_t b) {
  return a - floordiv(a, b) * b;
}

// "1, 2, 4 or 8": the divisors of n (at most 12 of them), for "use one of".
std::string divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n && d.size() < 24; i++)
    if (n % i == 0) d.push_back(i), d.push_back(n / i);
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  if (d.size() > 12) d.resize(12);
  std::string s;
  for (size_t i = 0; i < d.size(); i++) s += (i == 0 ? "" : i + 1 == d.size() ? " or " : ", ") + std::to_string(d[i]);
  return s;
}

// The nearest multiples of m around n (n itself excluded): "60 or 64".
std::string multiples_near(int64_t n, int64_t m) {
  const int64_t below = n / m * m, above = below + m;
  return below > 0 ? fmt::format("{} or {}", below, above) : std::to_string(above);
}

struct Plan {
  const PipelineFlags& f;
  bool first_set, last_set, e, l;
  int64_t vpp = 1;
  std::string vpp_source;  // the flag that set the virtual stages, with its value

  // The uneven ends given: "--decoder-first-pipeline-num-layers 3 and --decoder-last-pipeline-num-layers 4".
  std::string ends() const {
    const std::string first =
        fmt::format("--decoder-first-pipeline-num-layers {}", f.decoder_first_pipeline_num_layers);
    const std::string last = fmt::format("--decoder-last-pipeline-num-layers {}", f.decoder_last_pipeline_num_layers);
    return first_set && last_set ? first + " and " + last : first_set ? first : last;
  }
  std::string accounted() const {
    return e && l ? "--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split"
           : e    ? "--account-for-embedding-in-pipeline-split"
                  : "--account-for-loss-in-pipeline-split";
  }

  // "--num-layers 63 + 1 (embedding) + 1 (loss) = 65" or "--num-layers 64".
  std::string counted() const {
    if (!e && !l) return fmt::format("--num-layers {}", f.num_layers);
    return fmt::format("--num-layers {}{}{} = {} (the {} counted as a layer)", f.num_layers,
                       e ? " + 1 (--account-for-embedding-in-pipeline-split)" : "",
                       l ? " + 1 (--account-for-loss-in-pipeline-split)" : "", f.num_layers + e + l,
                       e && l ? "embedding and the loss each"
                       : e    ? "embedding"
                              : "loss");
  }

  // The (pp_rank, vstage) decoder layer count, as get_num_layers_to_build computes it (its asserts as checks).
  int64_t layers_to_build(int64_t r, int64_t v) const {
    const int64_t pp = f.pp, L = f.num_layers;
    int64_t per_rank = 0;
    if (first_set || last_set) {
      const int64_t left = pp - first_set - last_set;
      const int64_t to_distribute = L - (first_set ? f.decoder_first_pipeline_num_layers : 0) -
                                    (last_set ? f.decoder_last_pipeline_num_layers : 0);
      if (left > 0) per_rank = floordiv(to_distribute, left);
      if (r == 0 && first_set) per_rank = f.decoder_first_pipeline_num_layers;
      if (r == pp - 1 && last_set) per_rank = f.decoder_last_pipeline_num_layers;
    } else {
      per_rank = (L + e + l) / pp;
    }
    int64_t build = per_rank;
    if (vpp > 1 && pp > 1) {
      MOE_CHECK(pymod(per_rank, vpp) == 0,
                "PP rank {} holds {} decoder layers, which do not split into the {} virtual stages of {} (equal "
                "shares, as Megatron requires): use {} virtual stages, or {}",
                r, per_rank, vpp, vpp_source, divisors(std::max<int64_t>(per_rank, 1)),
                first_set || last_set ? "first/last stage sizes that are multiples of it"
                                      : fmt::format("--num-layers a multiple of {} x {}", pp, vpp));
      build = per_rank / vpp;
    }
    if (e && v == 0 && r == 0) build -= 1;
    if (l && v == vpp - 1 && r == pp - 1) build -= 1;
    MOE_CHECK(build >= 0,
              "PP rank {} virtual stage {} has no room for the {} it counts as a layer: {} over {} stages x {} "
              "virtual stages leaves it {} layer(s)",
              r, v, e && v == 0 && r == 0 ? "embedding" : "loss", counted(), pp, vpp, build + 1);
    return build;
  }

  // The first decoder layer of (pp_rank, vstage), as get_transformer_layer_offset computes it.
  int64_t layer_offset(int64_t r, int64_t v) const {
    const int64_t pp = f.pp, L = f.num_layers;
    if (pp == 1) return 0;
    if (first_set || last_set) {
      const int64_t middle_stages = pp - first_set - last_set;
      const int64_t fl = first_set ? f.decoder_first_pipeline_num_layers : 0;
      const int64_t ll = last_set ? f.decoder_last_pipeline_num_layers : 0;
      const int64_t middle = L - fl - ll, middle_rank = first_set ? r - 1 : r;
      if (vpp > 1) {
        const int64_t cf = floordiv(fl, vpp), cl = floordiv(ll, vpp), cm = floordiv(middle, vpp);
        const int64_t total = cf + cm + cl;
        // Megatron divides by the middle stages even when there are none (PP 2 with both ends set), where its
        // product is 0 (middle_rank 0): that product here.
        const int64_t per_middle = middle_stages > 0 ? floordiv(cm, middle_stages) : 0;
        return r == 0 ? v * total : v * total + cf + middle_rank * per_middle;
      }
      const int64_t per = middle_stages > 0 ? floordiv(middle, middle_stages) : 0;
      return r == 0 ? 0 : middle_rank * per + fl;
    }
    const int64_t n = L + e + l, per = n / pp;
    int64_t offset = r * per;
    if (vpp > 1) offset = v * (n / vpp) + r * (per / vpp);
    if (e && !(v == 0 && r == 0)) offset -= 1;
    return offset;
  }
};

PipelineLayout plan(const PipelineFlags& f, bool suggest);

// A value of `field` near its current one for which the whole plan passes (searching +-16), for the messages.
std::string suggestion(const PipelineFlags& f, int64_t PipelineFlags::*field, const char* flag) {
  for (int64_t d = 1; d <= 16; d++)
    for (int64_t sign : {-1, 1}) {
      PipelineFlags g = f;
      if (__builtin_add_overflow(f.*field, sign * d, &(g.*field)) || g.*field <= 0) continue;
      try {
        plan(g, false);
        return fmt::format(" (for example --{} {})", flag, g.*field);
      } catch (const Error&) {
      }
    }
  return "";
}

// The uneven first/last stages (TransformerConfig's checks, then two of its consequences Megatron does not check).
void check_uneven(const Plan& p, bool suggest) {
  const PipelineFlags& f = p.f;
  int64_t left = f.num_layers, stages = f.pp;
  auto hint = [&]() -> std::string {  // only on failure (MOE_CHECK formats its message then)
    if (!suggest) return "";
    return p.first_set
               ? suggestion(f, &PipelineFlags::decoder_first_pipeline_num_layers, "decoder-first-pipeline-num-layers")
               : suggestion(f, &PipelineFlags::decoder_last_pipeline_num_layers, "decoder-last-pipeline-num-layers");
  };
  for (auto [set, n, which] : {std::tuple{p.first_set, f.decoder_first_pipeline_num_layers, "first"},
                               std::tuple{p.last_set, f.decoder_last_pipeline_num_layers, "last"}}) {
    if (!set) continue;
    MOE_CHECK(n > 0, "--decoder-{}-pipeline-num-layers {} must be larger than 0", which, n);
    MOE_CHECK(p.vpp == 1 || n % p.vpp == 0,
              "--decoder-{}-pipeline-num-layers {} must be divisible by the {} virtual stages per pipeline rank of {}: "
              "each virtual stage of the {} pipeline rank holds an equal share{}",
              which, n, p.vpp, p.vpp_source, which, hint());
    MOE_CHECK(!__builtin_sub_overflow(left, n, &left), "{} hold more than --num-layers {}", p.ends(), f.num_layers);
    stages -= 1;
  }
  if (stages < 0) {  // PP 1 with both ends set: the one stage is first and last, and Megatron builds the last's count
    MOE_CHECK(f.decoder_last_pipeline_num_layers == f.num_layers && left != 0,
              "--pipeline-model-parallel-size 1 has one stage, both the first and the last: "
              "--decoder-first-pipeline-num-layers {} and --decoder-last-pipeline-num-layers {} cannot both describe "
              "it for --num-layers {}; leave them out",
              f.decoder_first_pipeline_num_layers, f.decoder_last_pipeline_num_layers, f.num_layers);
    return;
  }
  MOE_CHECK((left != 0) == (stages != 0),
            "{} leave {} layers of --num-layers {} for the {} middle stage(s) of --pipeline-model-parallel-size {}: "
            "{}{}",
            p.ends(), left, f.num_layers, stages, f.pp,
            stages == 0 ? "with no middle stage the first and last stages must hold every layer"
                        : "every middle stage needs layers",
            hint());
  MOE_CHECK(left >= 0, "{} hold more than --num-layers {}{}", p.ends(), f.num_layers, hint());
  if (stages == 0) return;
  MOE_CHECK(left % stages == 0,
            "the {} layers {} leave of --num-layers {} do not split evenly over the {} middle stage(s) of "
            "--pipeline-model-parallel-size {}: they must be a multiple of {}{}",
            left, p.ends(), f.num_layers, stages, f.pp, stages * p.vpp, hint());
  MOE_CHECK(p.vpp == 1 || (left / stages) % p.vpp == 0,
            "each middle pipeline rank holds {} layers ({} leave {} for {}), which do not split into the {} virtual "
            "stages of {}: the layers left for the middle stages must be a multiple of {} x {}{}",
            left / stages, p.ends(), left, stages, p.vpp, p.vpp_source, stages, p.vpp, hint());
}

PipelineLayout plan(const PipelineFlags& f, bool suggest) {
  const int64_t L = f.num_layers, pp = f.pp;
  MOE_CHECK(L >= 1, "--num-layers {} must be positive", L);
  MOE_CHECK(pp >= 1, "--pipeline-model-parallel-size {} must be positive", pp);
  MOE_CHECK(f.mtp_num_layers >= 0, "--mtp-num-layers {} must be >= 0", f.mtp_num_layers);
  for (auto [v, name] : {std::pair{f.num_layers_per_virtual_stage, "num-layers-per-virtual-pipeline-stage"},
                         std::pair{f.num_virtual_stages_per_rank, "num-virtual-stages-per-pipeline-rank"},
                         std::pair{f.decoder_first_pipeline_num_layers, "decoder-first-pipeline-num-layers"},
                         std::pair{f.decoder_last_pipeline_num_layers, "decoder-last-pipeline-num-layers"}})
    MOE_CHECK(v == -1 || v > 0, "--{} {} must be larger than 0 (-1: unset, Megatron's None)", name, v);
  Plan p{f,
         f.decoder_first_pipeline_num_layers != -1,
         f.decoder_last_pipeline_num_layers != -1,
         f.account_for_embedding,
         f.account_for_loss,
         1,
         ""};
  const bool lpvs = f.num_layers_per_virtual_stage != -1, nvs = f.num_virtual_stages_per_rank != -1;
  const bool layout = !f.layout.empty();

  // arguments.py: one way of asking for virtual stages, and the virtual-stage count.
  MOE_CHECK(lpvs + nvs + layout <= 1,
            "give at most one of --num-layers-per-virtual-pipeline-stage ({}), --num-virtual-stages-per-pipeline-rank "
            "({}) and --pipeline-model-parallel-layout ('{}'): each sets the virtual stages",
            f.num_layers_per_virtual_stage, f.num_virtual_stages_per_rank, f.layout);
  std::vector<std::string> parsed;
  if (layout) {
    parsed = parse_pipeline_layout(f.layout);
    const int64_t n = static_cast<int64_t>(parsed.size());
    MOE_CHECK(n % pp == 0,
              "--pipeline-model-parallel-layout '{}' has {} stages, not a multiple of --pipeline-model-parallel-size "
              "{}: give PP x (virtual stages per rank) stages separated by '|'",
              f.layout, n, pp);
    p.vpp = n / pp;
    p.vpp_source = fmt::format("--pipeline-model-parallel-layout '{}' ({} stages)", f.layout, n);
  } else if (lpvs) {
    MOE_CHECK(!p.first_set && !p.last_set,
              "--num-layers-per-virtual-pipeline-stage {} with {}: use --num-virtual-stages-per-pipeline-rank to give "
              "the virtual stages of an uneven pipeline (as Megatron requires)",
              f.num_layers_per_virtual_stage, p.ends());
    const int64_t n = L + p.e + p.l;
    MOE_CHECK(n % pp == 0,
              "{} is not divisible by --pipeline-model-parallel-size {}: use --num-layers {} (each stage holds an "
              "equal share)",
              p.counted(), pp, multiples_near(L, pp));
    const int64_t per_stage = n / pp;
    MOE_CHECK(per_stage % f.num_layers_per_virtual_stage == 0,
              "each pipeline stage holds {} layers ({} / {} stages), not divisible by "
              "--num-layers-per-virtual-pipeline-stage {}: use {}",
              per_stage, p.counted(), pp, f.num_layers_per_virtual_stage, divisors(per_stage));
    p.vpp = per_stage / f.num_layers_per_virtual_stage;
    p.vpp_source = fmt::format("--num-layers-per-virtual-pipeline-stage {}", f.num_layers_per_virtual_stage);
  } else if (nvs) {
    p.vpp = f.num_virtual_stages_per_rank;
    p.vpp_source = fmt::format("--num-virtual-stages-per-pipeline-rank {}", p.vpp);
  } else if (!p.first_set && !p.last_set) {
    MOE_CHECK((L + p.e + p.l) % pp == 0,
              "{} is not divisible by --pipeline-model-parallel-size {}: each stage holds an equal share; use "
              "--num-layers {}, or size the first or last stage with --decoder-first-pipeline-num-layers / "
              "--decoder-last-pipeline-num-layers, or lay the stages out with --pipeline-model-parallel-layout",
              p.counted(), pp, multiples_near(L, pp));
  }
  if (p.vpp > 1)
    MOE_CHECK(f.overlap_p2p_comm ? pp > 1 : pp > 2,
              "{} gives {} virtual stages per pipeline rank (the interleaved schedule), which need "
              "--pipeline-model-parallel-size > {}, got {}{}",
              p.vpp_source, p.vpp, f.overlap_p2p_comm ? 1 : 2, pp,
              f.overlap_p2p_comm ? ""
                                 : " (with --no-overlap-p2p-communication; Megatron avoids two sends between "
                                   "the same two ranks in one batch)");

  // TransformerConfig.
  MOE_CHECK(!((p.first_set || p.last_set) && (p.e || p.l)),
            "{} and {} are exclusive (as in Megatron): give the stage sizes or count the embedding and loss as layers",
            p.ends(), p.accounted());
  if (layout) {
    MOE_CHECK(!p.first_set && !p.last_set && !p.e && !p.l,
              "--pipeline-model-parallel-layout lays out every stage: leave out --decoder-first-pipeline-num-layers "
              "({}), --decoder-last-pipeline-num-layers ({}), --account-for-embedding-in-pipeline-split ({}) and "
              "--account-for-loss-in-pipeline-split ({})",
              f.decoder_first_pipeline_num_layers, f.decoder_last_pipeline_num_layers, p.e, p.l);
    return plan_from_layout_string(f, parsed);
  }
  if (p.first_set || p.last_set) {
    check_uneven(p, suggest);
  } else if (p.e || p.l) {
    const int64_t n = L + p.e + p.l;
    MOE_CHECK(n % pp == 0, "{} is not divisible by --pipeline-model-parallel-size {}: use --num-layers {}", p.counted(),
              pp, multiples_near(L, pp));
    MOE_CHECK(p.vpp == 1 || (n / pp) % p.vpp == 0,
              "each pipeline rank holds {} layers ({} / {}), which do not split into the {} virtual stages of {}: use "
              "{} virtual stages per rank",
              n / pp, p.counted(), pp, p.vpp, p.vpp_source, divisors(n / pp));
  }

  // A plan is a few entries per stage; a run has at most as many stages as ranks. Megatron's own checks of each
  // rank's share come first.
  if (pp <= kMaxStages)
    for (int64_t r = 0; r < pp; r++) p.layers_to_build(r, 0);
  MOE_CHECK(pp <= kMaxStages && p.vpp <= kMaxStages / pp,
            "--pipeline-model-parallel-size {} x {} virtual stages per rank is beyond the {} pipeline stages moecore "
            "plans for",
            pp, p.vpp, kMaxStages);
  // get_num_layers_to_build and get_transformer_layer_offset, stage by stage in model-chunk order.
  PipelineLayout out;
  out.pp = pp;
  out.vpp = p.vpp;
  std::vector<std::string> cells;
  int64_t next = 0;
  bool contiguous = true;
  for (int64_t v = 0; v < p.vpp; v++)
    for (int64_t r = 0; r < pp; r++) {
      StageLayers st;
      st.num_layers = p.layers_to_build(r, v);
      st.first_layer = p.layer_offset(r, v);
      contiguous = contiguous && st.first_layer == next;
      next += st.num_layers;
      out.stages.push_back(st);
      cells.push_back(st.num_layers == 0
                          ? fmt::format("none (at {})", st.first_layer)
                          : fmt::format("layers {}-{}", st.first_layer, st.first_layer + st.num_layers - 1));
    }
  MOE_CHECK(contiguous && next == L,
            "this pipeline split would not build every one of --num-layers {} exactly once (Megatron would build "
            "these, {} in all):\n{}",
            L, next, stage_table(pp, p.vpp, cells));
  out.stages.front().embedding = true;
  out.stages.back().loss = true;
  out.stages.back().mtp_layers = f.mtp_num_layers;  // without a layout Megatron puts MTP on the last stage
  return out;
}

}  // namespace

const StageLayers& PipelineLayout::at(int64_t pp_rank, int64_t vstage) const {
  MOE_ASSERT(pp_rank >= 0 && pp_rank < pp && vstage >= 0 && vstage < vpp);
  return stages[static_cast<size_t>(vstage * pp + pp_rank)];
}

int64_t PipelineLayout::num_layers() const {
  int64_t n = 0;
  for (const auto& s : stages) n += s.num_layers;
  return n;
}

std::pair<int64_t, int64_t> PipelineLayout::stage_of_layer(int64_t layer) const {
  for (size_t i = 0; i < stages.size(); i++)
    if (layer >= stages[i].first_layer && layer < stages[i].first_layer + stages[i].num_layers)
      return {static_cast<int64_t>(i) % pp, static_cast<int64_t>(i) / pp};
  MOE_ASSERT_MSG(false, "decoder layer {} is on no stage", layer);
  return {-1, -1};
}

std::string PipelineLayout::describe() const {
  std::vector<std::string> cells;
  for (const auto& s : stages) {
    std::vector<std::string> parts;
    if (s.embedding) parts.emplace_back("embedding");
    if (s.num_layers == 1) parts.push_back(fmt::format("decoder {}", s.first_layer));
    if (s.num_layers > 1)
      parts.push_back(fmt::format("decoder {}-{}", s.first_layer, s.first_layer + s.num_layers - 1));
    if (s.mtp_layers > 0) parts.push_back(s.mtp_layers == 1 ? "mtp" : fmt::format("mtp*{}", s.mtp_layers));
    if (s.loss) parts.emplace_back("loss");
    std::string cell;
    for (const auto& x : parts) cell += (cell.empty() ? "" : ", ") + x;
    cells.push_back(cell.empty() ? "(empty stage)" : cell);
  }
  return fmt::format("pipeline: {} decoder layers over {} stage(s){}\n", num_layers(), pp,
                     vpp > 1 ? fmt::format(" x {} virtual stages (interleaved)", vpp) : "") +
         stage_table(pp, vpp, cells);
}

PipelineFlags pipeline_flags(const TrainConfig& c) {
  PipelineFlags f;
  f.num_layers = c.num_layers;
  f.pp = c.pipeline_model_parallel_size;
  f.num_layers_per_virtual_stage = c.num_layers_per_virtual_pipeline_stage;
  f.num_virtual_stages_per_rank = c.num_virtual_stages_per_pipeline_rank;
  f.decoder_first_pipeline_num_layers = c.decoder_first_pipeline_num_layers;
  f.decoder_last_pipeline_num_layers = c.decoder_last_pipeline_num_layers;
  f.account_for_embedding = c.account_for_embedding_in_pipeline_split;
  f.account_for_loss = c.account_for_loss_in_pipeline_split;
  f.layout = c.pipeline_model_parallel_layout;
  f.mtp_num_layers = c.mtp_num_layers;
  // --no-overlap-p2p-communication has no effect on moecore's transport, but Megatron's check on it still holds.
  for (const auto& line : c.no_effect)
    if (line.rfind("--no-overlap-p2p-communication", 0) == 0) f.overlap_p2p_comm = false;
  return f;
}

PipelineLayout plan_pipeline(const PipelineFlags& f) {
  return plan(f, true);
}

void check_pipeline_microbatches(const PipelineLayout& layout, int64_t num_microbatches,
                                 int64_t microbatch_group_size) {
  const int64_t m = num_microbatches, pp = layout.pp;
  MOE_CHECK(m >= 1, "a step needs at least one micro-batch per data-parallel rank, got {}", m);
  if (!layout.interleaved()) return;  // 1F1B runs any count
  const int64_t n = microbatch_group_size > 0 ? microbatch_group_size : pp;
  const std::string what = fmt::format(
      "the interleaved schedule ({} virtual stages per pipeline rank) runs {} micro-batch(es) per step "
      "(--global-batch-size / (--micro-batch-size x data-parallel size))",
      layout.vpp, m);
  if (microbatch_group_size <= 0) {  // Megatron's default group, PP: both of its rules say "a multiple of PP"
    MOE_CHECK(m % pp == 0 && m >= pp,
              "{}, which must be a multiple of --pipeline-model-parallel-size {} (as Megatron's interleaved schedule "
              "requires): use {} micro-batches",
              what, pp, multiples_near(m, pp));
    return;
  }
  MOE_CHECK(n <= m && n >= pp,
            "{}: the micro-batches run together on a virtual stage, {}, must lie in [PP {}, micro-batches {}]", what, n,
            pp, m);
  const int64_t rest = m % n;
  MOE_CHECK(rest == 0 || rest >= pp,
            "{}: the last group of micro-batches, {} of them ({} modulo the group size {}), must be empty or at least "
            "--pipeline-model-parallel-size {} (a smaller one stalls the pipeline)",
            what, rest, m, n, pp);
}

}  // namespace moecore::train
