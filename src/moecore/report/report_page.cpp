// Charts planned from run histories, and the HTML page (see report_page.h).
#include "moecore/report/report_page.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "moecore/core/error.h"

namespace moecore::report {

namespace {
using nlohmann::json;
using Value = std::function<std::optional<double>(const json& row)>;

// A number of a row (null, NaN or absent: no value; the curve has a gap there, which is what a diverged step is).
std::optional<double> number(const json& row, const std::string& key, const std::string& sub = "") {
  auto it = row.find(key);
  if (it == row.end()) return std::nullopt;
  const json* v = &*it;
  if (!sub.empty()) {
    if (!v->is_object()) return std::nullopt;
    auto s = v->find(sub);
    if (s == v->end()) return std::nullopt;
    v = &*s;
  }
  if (v->is_null()) return std::nan("");  // the metrics file writes NaN as null
  if (!v->is_number()) return std::nullopt;
  return v->get<double>();
}

Value key_of(const std::string& key, double scale = 1.0) {
  return [key, scale](const json& row) -> std::optional<double> {
    if (auto v = number(row, key)) return *v * scale;
    return std::nullopt;
  };
}

// [[iteration, value], ...] of the rows that have the value (null where it is NaN); empty when none has it.
json points(const std::vector<json>& rows, const Value& value) {
  json out = json::array();
  for (const json& row : rows)
    if (const auto v = value(row)) out.push_back({row.at("iteration"), std::isfinite(*v) ? json(*v) : json(nullptr)});
  return out;
}

json series(const std::string& name, json data, int color, const char* dash = "solid") {
  return {{"name", name}, {"data", std::move(data)}, {"color", color}, {"dash", dash}};
}

// "name" alone with one run; "run · name" when runs are overlaid.
std::string label(const std::vector<RunHistory>& runs, size_t r, const std::string& what) {
  if (runs.size() == 1) return what;
  return what.empty() ? runs[r].name : runs[r].name + " · " + what;
}

const char* dash_of(size_t r) {
  static const char* const d[] = {"solid", "dashed", "dotted"};
  return d[r % 3];
}

// One line per run of `value`; the chart is left out when no run has it.
void add_per_run(json& charts, const std::vector<RunHistory>& runs, const std::string& title, const std::string& y,
                 const Value& value) {
  json s = json::array();
  for (size_t r = 0; r < runs.size(); r++) {
    json d = points(runs[r].train, value);
    if (!d.empty()) s.push_back(series(label(runs, r, ""), std::move(d), static_cast<int>(r)));
  }
  if (!s.empty()) charts.push_back({{"kind", "line"}, {"title", title}, {"y", y}, {"series", std::move(s)}});
}

// The keys of object-valued field `key` (router_entropy: layer_0, layer_1, ...) over all rows of all runs, in
// layer order.
std::vector<std::string> layer_keys(const std::vector<RunHistory>& runs, const std::string& key) {
  std::map<long, std::string> by_index;
  for (const auto& run : runs)
    for (const json& row : run.train)
      if (auto it = row.find(key); it != row.end() && it->is_object())
        for (const auto& [k, v] : it->items())
          if (k.rfind("layer_", 0) == 0) by_index[std::strtol(k.c_str() + 6, nullptr, 10)] = k;
  std::vector<std::string> out;
  for (const auto& [i, k] : by_index) out.push_back(k);
  return out;
}

std::string layer_label(const std::string& key) {  // layer_3 -> layer 3
  return "layer " + key.substr(key.find('_') + 1);
}

// One line per run and layer of object field `key` (color by layer, dash by run).
void add_per_layer(json& charts, const std::vector<RunHistory>& runs, const std::string& title, const std::string& y,
                   const std::string& key, std::optional<double> ref = std::nullopt, bool only_if_nonzero = false) {
  const auto keys = layer_keys(runs, key);
  json s = json::array();
  bool nonzero = false;
  for (size_t r = 0; r < runs.size(); r++)
    for (size_t l = 0; l < keys.size(); l++) {
      json d = points(runs[r].train, [&](const json& row) { return number(row, key, keys[l]); });
      for (const auto& p : d) nonzero = nonzero || (p[1].is_number() && p[1].get<double>() != 0.0);
      if (!d.empty())
        s.push_back(series(label(runs, r, layer_label(keys[l])), std::move(d), static_cast<int>(l), dash_of(r)));
    }
  if (s.empty() || (only_if_nonzero && !nonzero)) return;
  json c = {{"kind", "line"}, {"title", title}, {"y", y}, {"series", std::move(s)}};
  if (ref) c["ref"] = *ref;
  charts.push_back(std::move(c));
}

// --moe-per-layer-logging writes moe/<loss>_layer_<i>: one chart per loss, a line per run and layer.
void add_per_layer_losses(json& charts, const std::vector<RunHistory>& runs) {
  std::map<std::string, std::map<long, std::string>> losses;  // loss -> layer -> key
  for (const auto& run : runs)
    for (const json& row : run.train)
      for (const auto& [k, v] : row.items()) {
        const size_t at = k.rfind("_layer_");
        if (k.rfind("moe/", 0) != 0 || at == std::string::npos) continue;
        losses[k.substr(4, at - 4)][std::strtol(k.c_str() + at + 7, nullptr, 10)] = k;
      }
  for (const auto& [loss, layers] : losses) {
    json s = json::array();
    for (size_t r = 0; r < runs.size(); r++) {
      int l = 0;
      for (const auto& [i, k] : layers) {
        json d = points(runs[r].train, key_of(k));
        if (!d.empty()) s.push_back(series(label(runs, r, fmt::format("layer {}", i)), std::move(d), l, dash_of(r)));
        l++;
      }
    }
    if (!s.empty())
      charts.push_back({{"kind", "line"}, {"title", loss + " per layer"}, {"y", "L / coeff"}, {"series", s}});
  }
}

// Timers written as "timers/<name>" (seconds per iteration): one chart, a line per run and timer.
void add_timers(json& charts, const std::vector<RunHistory>& runs) {
  std::set<std::string> names;
  for (const auto& run : runs)
    for (const json& row : run.train)
      for (const auto& [k, v] : row.items())
        if (k.rfind("timers/", 0) == 0 && v.is_number()) names.insert(k);
  json s = json::array();
  for (size_t r = 0; r < runs.size(); r++) {
    int t = 0;
    for (const auto& k : names) {
      json d = points(runs[r].train, key_of(k));
      if (!d.empty()) s.push_back(series(label(runs, r, k.substr(7)), std::move(d), t, dash_of(r)));
      t++;
    }
  }
  // --timing-log-level's records: the slowest rank's milliseconds per iteration of each timer, in seconds.
  std::set<std::string> logged;
  for (const auto& run : runs)
    for (const json& row : run.timers)
      for (const auto& [k, v] : row.at("timers").items())
        if (!names.count("timers/" + k)) logged.insert(k);
  for (size_t r = 0; r < runs.size(); r++) {
    int t = static_cast<int>(names.size());
    for (const auto& k : logged) {
      json d = points(runs[r].timers, [&k](const json& row) -> std::optional<double> {
        const json& v = row.at("timers");
        if (!v.contains(k) || !v[k].contains("max_ms") || !v[k]["max_ms"].is_number()) return std::nullopt;
        return v[k]["max_ms"].get<double>() / 1000.0;
      });
      if (!d.empty()) s.push_back(series(label(runs, r, k + " (max over ranks)"), std::move(d), t, dash_of(r)));
      t++;
    }
  }
  if (!s.empty()) charts.push_back({{"kind", "line"}, {"title", "Timers"}, {"y", "seconds"}, {"series", s}});
}

// One heatmap per MoE layer of one run: tokens per expert over the logged iterations, as load over the mean load
// (1 = balanced, 0 = an expert that got nothing), with the layer's router entropy under it.
void add_expert_loads(json& charts, const std::vector<RunHistory>& runs, size_t r) {
  const RunHistory& run = runs[r];
  for (const std::string& key : layer_keys({run}, "tokens_per_expert")) {
    std::vector<const json*> rows;
    for (const json& row : run.train)
      if (auto it = row.find("tokens_per_expert"); it != row.end() && it->is_object() && it->contains(key))
        rows.push_back(&row);
    if (rows.empty()) continue;
    const size_t stride = (rows.size() + kMaxHeatmapColumns - 1) / kMaxHeatmapColumns;
    json x = json::array(), cells = json::array(), entropy = json::array();
    size_t experts = 0;
    for (size_t i = 0; i < rows.size(); i += stride) {
      const json& row = *rows[i];
      const json& tpe = row["tokens_per_expert"][key];
      if (!tpe.is_array()) continue;
      const int64_t col = static_cast<int64_t>(x.size());
      x.push_back(row.at("iteration"));
      double sum = 0;
      for (const auto& t : tpe) sum += t.is_number() ? t.get<double>() : 0.0;
      const double mean = tpe.empty() ? 0.0 : sum / static_cast<double>(tpe.size());
      for (size_t e = 0; e < tpe.size(); e++) {
        const double t = tpe[e].is_number() ? tpe[e].get<double>() : 0.0;
        cells.push_back({col, e, mean > 0 ? t / mean : 0.0, t});
      }
      experts = std::max(experts, tpe.size());
      if (auto h = number(row, "router_entropy", key); h && std::isfinite(*h)) entropy.push_back({col, *h});
    }
    if (experts == 0) continue;
    const std::string title =
        fmt::format("Expert load, {}{}", layer_label(key), runs.size() > 1 ? " · " + run.name : std::string());
    charts.push_back({{"kind", "expert_load"},
                      {"title", title},
                      {"experts", experts},
                      {"x", std::move(x)},
                      {"cells", std::move(cells)},
                      {"entropy", std::move(entropy)},
                      {"max_entropy", std::log(static_cast<double>(experts))}});
  }
}

// The widest expert count seen (for the entropy chart's reference line ln E).
std::optional<double> max_entropy(const std::vector<RunHistory>& runs) {
  size_t e = 0;
  for (const auto& run : runs)
    for (const json& row : run.train)
      if (auto it = row.find("tokens_per_expert"); it != row.end() && it->is_object())
        for (const auto& [k, v] : it->items()) e = std::max(e, v.is_array() ? v.size() : 0);
  if (e == 0) return std::nullopt;
  return std::log(static_cast<double>(e));
}
}  // namespace

nlohmann::json plan_charts(const std::vector<RunHistory>& runs) {
  json charts = json::array();
  {  // training and validation loss together
    json s = json::array();
    for (size_t r = 0; r < runs.size(); r++) {
      json t = points(runs[r].train, key_of("lm_loss"));
      json v = points(runs[r].valid, key_of("lm_loss"));
      if (!t.empty()) s.push_back(series(label(runs, r, "train"), std::move(t), static_cast<int>(r)));
      if (!v.empty()) s.push_back(series(label(runs, r, "validation"), std::move(v), static_cast<int>(r), "dashed"));
    }
    if (!s.empty()) charts.push_back({{"kind", "line"}, {"title", "LM loss"}, {"y", "nats"}, {"series", s}});
  }
  add_per_run(charts, runs, "Learning rate", "lr", key_of("lr"));
  add_per_run(charts, runs, "Gradient norm (before clipping)", "norm", key_of("grad_norm"));
  add_per_run(charts, runs, "Throughput", "tokens/s", key_of("tokens_per_sec"));
  add_per_run(charts, runs, "Model FLOP utilization (of the measured GEMM peak)", "%",
              key_of("gflops_ratio_to_gemm_peak", 100.0));
  add_per_run(charts, runs, "Throughput per GPU", "TFLOP/s", key_of("throughput_tflops_per_gpu"));
  add_per_run(charts, runs, "Peak memory", "MiB", key_of("peak_memory_bytes", 1.0 / (1024.0 * 1024.0)));
  {  // the MoE losses as Megatron logs them (L / coeff), every kind a run has
    json s = json::array();
    const char* const kinds[] = {"load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss",
                                 "z_loss"};
    for (size_t r = 0; r < runs.size(); r++)
      for (int k = 0; k < 4; k++) {
        json d = points(runs[r].train, key_of(kinds[k]));
        if (!d.empty()) s.push_back(series(label(runs, r, kinds[k]), std::move(d), k, dash_of(r)));
      }
    if (!s.empty())
      charts.push_back({{"kind", "line"}, {"title", "MoE auxiliary and z losses"}, {"y", "L / coeff"}, {"series", s}});
  }
  add_per_run(charts, runs, "Max / mean expert load (worst layer)", "ratio", key_of("max_over_mean_expert_load"));
  add_per_layer(charts, runs, "Router entropy per layer (ln E: uniform)", "nats", "router_entropy", max_entropy(runs));
  add_per_layer(charts, runs, "Dropped assignments per layer", "assignments", "dropped_assignments", std::nullopt,
                true);
  add_per_layer_losses(charts, runs);
  add_per_run(charts, runs, "Parameter norm", "norm", key_of("params_norm"));
  add_per_run(charts, runs, "Zeros in gradients", "count", key_of("num_zeros"));
  add_timers(charts, runs);
  for (size_t r = 0; r < runs.size(); r++) add_expert_loads(charts, runs, r);
  return charts;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string json_for_script(const nlohmann::json& j) {
  // Invalid UTF-8 in a run name (a path from the file system) is replaced, not thrown.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) switch (c) {
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += c;
    }
  return out;
}

}  // namespace moecore::report
