// --pipeline-model-parallel-layout: the string's expansion (Megatron's parse_str_to_list), its checks against the
// model (validate_layer_layout) and the stages it gives; and the stage table both it and PipelineLayout::describe
// print. The other ways of splitting the layers: pipeline_layout.cpp.
#include <fmt/format.h>

#include <algorithm>

#include "moecore/core/error.h"
#include "moecore/train/pipeline/pipeline_layout.h"

namespace moecore::train {
namespace {

// Bounds the expansion ("t*99999999999" would exhaust memory in Megatron too).
constexpr size_t kMaxExpandedLength = size_t{1} << 20;

const char* kKnownCharacters =
    "E (embedding), t (transformer decoder layer), m (MTP layer), L (loss), '|' between stages, (...)*n and x*n "
    "for repetition, commas (ignored)";

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// One re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), s) of Megatron's, scanned by hand (std::regex recurses
// per character and overflows the stack on long strings): non-overlapping matches, left to right, each replaced by
// group 1 repeated group 2 times. `grouped`: the pattern \(([^)]+)\)\*(\d+), whose group ends at the first ')' after
// its '('; otherwise (.)\*(\d+), any one character but a newline. \d+ takes every digit that follows.
std::string unroll(const std::string& layout, const std::string& s, bool grouped) {
  std::string out;
  size_t i = 0, close = 0;  // close: the first ')' after the last '(' looked at (linear time over many '(')
  while (i < s.size()) {
    size_t unit_begin = i, unit_end = i + 1;  // group 1
    bool match = false;
    if (grouped && s[i] == '(') {
      if (close != std::string::npos && close <= i) close = s.find(')', i + 1);
      unit_begin = i + 1;
      unit_end = close;
      match = unit_end != std::string::npos && unit_end > unit_begin;
    } else if (!grouped) {
      match = s[i] != '\n';
    }
    const size_t star = grouped ? unit_end + 1 : unit_end;
    match = match && star + 1 < s.size() && s[star] == '*' && is_digit(s[star + 1]);
    if (!match) {
      out += s[i++];
      continue;
    }
    size_t end = star + 1, n = 0;
    const size_t unit = unit_end - unit_begin;
    const size_t budget = kMaxExpandedLength - std::min(out.size(), kMaxExpandedLength);
    for (; end < s.size() && is_digit(s[end]); end++) {
      n = n * 10 + static_cast<size_t>(s[end] - '0');
      MOE_CHECK(n * unit <= budget,
                "--pipeline-model-parallel-layout '{}': '{}' expands the layout beyond {} characters; describe the "
                "stages with fewer repetitions",
                layout, s.substr(i, end + 1 - i), kMaxExpandedLength);
    }
    for (size_t k = 0; k < n; k++) out.append(s, unit_begin, unit);
    i = end;
  }
  MOE_CHECK(out.size() <= kMaxExpandedLength, "--pipeline-model-parallel-layout '{}' expands beyond {} characters",
            layout, kMaxExpandedLength);
  return out;
}

const char* layer_name(char c) {
  switch (c) {
    case 'E':
      return "embedding";
    case 't':
      return "decoder";
    case 'm':
      return "mtp";
    default:
      return "loss";
  }
}

// Megatron's pretty_repr of one stage: runs of a layer type as "decoder*3".
std::string stage_cell(const std::string& stage) {
  std::string cell;
  for (size_t i = 0; i < stage.size();) {
    size_t j = i;
    while (j < stage.size() && stage[j] == stage[i]) j++;
    cell += (cell.empty() ? "" : ",") + std::string(layer_name(stage[i]));
    if (j - i > 1) cell += fmt::format("*{}", j - i);
    i = j;
  }
  return cell.empty() ? "(empty stage)" : cell;
}

int64_t count(const std::string& stage, char c) {
  return static_cast<int64_t>(std::count(stage.begin(), stage.end(), c));
}

}  // namespace

std::vector<std::string> parse_pipeline_layout(const std::string& layout) {
  MOE_CHECK(layout.size() <= kMaxExpandedLength, "--pipeline-model-parallel-layout is longer than {} characters",
            kMaxExpandedLength);
  std::string s;
  for (char c : layout)
    if (c != ',') s += c;  // purely cosmetic commas
  // Megatron's two patterns, in its order: "(...)*n" (no nesting: the group stops at the first ')'), then "x*n".
  s = unroll(layout, unroll(layout, s, true), false);
  std::vector<std::string> stages(1);
  for (char c : s) {
    if (c == '|') {
      stages.emplace_back();
      continue;
    }
    MOE_CHECK(c == 'E' || c == 't' || c == 'm' || c == 'L',
              "--pipeline-model-parallel-layout '{}': invalid layer character '{}' in stage {} ('{}' after expanding "
              "repetitions); known: {}",
              layout, c, stages.size() - 1, s, kKnownCharacters);
    stages.back() += c;
  }
  return stages;
}

std::string stage_table(int64_t pp, int64_t vpp, const std::vector<std::string>& cells) {
  MOE_ASSERT(static_cast<int64_t>(cells.size()) == pp * vpp);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header{""};
  for (int64_t v = 0; v < vpp; v++) header.push_back(vpp > 1 ? fmt::format("VPP rank {}", v) : "");
  if (vpp > 1) rows.push_back(header);
  for (int64_t r = 0; r < pp; r++) {
    std::vector<std::string> row{fmt::format("PP rank {}", r)};
    for (int64_t v = 0; v < vpp; v++) row.push_back(cells[static_cast<size_t>(v * pp + r)]);
    rows.push_back(row);
  }
  std::vector<size_t> width(static_cast<size_t>(vpp) + 1, 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); i++) width[i] = std::max(width[i], row[i].size());
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); i++)
      line += fmt::format("{:<{}}", row[i], width[i] + (i + 1 < row.size() ? 4 : 0));
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += "  " + line + "\n";
  }
  return out;
}

PipelineLayout plan_from_layout_string(const PipelineFlags& f, const std::vector<std::string>& parsed) {
  const int64_t pp = f.pp, vpp = static_cast<int64_t>(parsed.size()) / pp;
  MOE_ASSERT(vpp >= 1 && vpp * pp == static_cast<int64_t>(parsed.size()));
  auto shown = [&] {  // only for a message (MOE_CHECK formats its arguments on failure)
    std::vector<std::string> cells;
    for (const auto& st : parsed) cells.push_back(stage_cell(st));
    return fmt::format(
        "--pipeline-model-parallel-layout '{}' parsed for --pipeline-model-parallel-size {} ({} "
        "stages: {} virtual per rank):\n{}",
        f.layout, pp, parsed.size(), vpp, stage_table(pp, vpp, cells));
  };
  auto layer = [&](int64_t r, int64_t v) -> const std::string& { return parsed[static_cast<size_t>(v * pp + r)]; };
  std::string flat;
  for (const auto& s : parsed) flat += s;  // layer order: virtual stage major, pipeline rank minor
  // Megatron's validate_layer_layout, in its order.
  MOE_CHECK(!flat.empty() && flat.front() == 'E',
            "the first layer of the layout must be the embedding (E), but it is {}; {}",
            flat.empty() ? "nothing" : layer_name(flat.front()), shown());
  MOE_CHECK(flat.back() == 'L', "the last layer of the layout must be the loss (L), but it is {}; {}",
            layer_name(flat.back()), shown());
  MOE_CHECK(count(flat, 'E') == 1, "the layout must hold the embedding (E) exactly once, not {} times; {}",
            count(flat, 'E'), shown());
  MOE_CHECK(count(flat, 'L') == 1, "the layout must hold the loss (L) exactly once, not {} times; {}", count(flat, 'L'),
            shown());
  MOE_CHECK(count(flat, 't') == f.num_layers,
            "the layout holds {} decoder layers (t) but --num-layers is {}: give it exactly {} t's; {}",
            count(flat, 't'), f.num_layers, f.num_layers, shown());
  MOE_CHECK(count(flat, 'm') == f.mtp_num_layers, "the layout holds {} MTP layers (m) but --mtp-num-layers is {}{}; {}",
            count(flat, 'm'), f.mtp_num_layers,
            f.mtp_num_layers == 0 ? " (leave m out, or set --mtp-num-layers to the m's)" : "", shown());
  const size_t first_mtp = flat.find('m');
  MOE_CHECK(first_mtp == std::string::npos || flat.find('t', first_mtp) == std::string::npos,
            "decoder layers (t) must all come before the MTP layers (m) in the layout; {}", shown());
  for (int64_t r = 0; r < pp; r++) {
    for (int64_t v = 0; v + 1 < vpp; v++)
      MOE_CHECK(count(layer(r, v), 'm') == 0,
                "MTP layers (m) must be in the last virtual stage of their pipeline rank (as Megatron requires), but "
                "PP rank {} holds them in virtual stage {} of {}; {}",
                r, v, vpp, shown());
    const int64_t m = count(layer(r, vpp - 1), 'm');
    MOE_CHECK(m == 0 || m == f.mtp_num_layers,
              "all {} MTP layers (m) must be in one stage, but PP rank {} virtual stage {} holds {}; {}",
              f.mtp_num_layers, r, vpp - 1, m, shown());
  }
  PipelineLayout out;
  out.pp = pp;
  out.vpp = vpp;
  int64_t next = 0;
  for (const auto& s : parsed) {
    StageLayers st;
    st.first_layer = next;
    st.num_layers = count(s, 't');
    st.mtp_layers = count(s, 'm');
    next += st.num_layers;
    out.stages.push_back(st);
  }
  // Megatron builds the embedding where pre_process is (the first stage) and the loss where post_process is (the
  // last); the checks above leave only empty stages before E and after L, so this is where the string puts them.
  out.stages.front().embedding = true;
  out.stages.back().loss = true;
  return out;
}

}  // namespace moecore::train
