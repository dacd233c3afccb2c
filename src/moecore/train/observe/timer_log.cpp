// Timers over the ranks (see timers.h).
#include "moecore/train/observe/timer_log.h"

#include <fmt/format.h>

#include <algorithm>

#include "moecore/core/tensor.h"

namespace moecore::train {

std::vector<std::string> logged_timer_names(int level) {
  std::vector<std::string> n;
  if (level >= 1)  // the step's phases (Megatron's level 1 list; moecore's optimizer has no loss-scale or copies)
    n = {"forward-backward",         "all-grads-sync",       "params-all-gather",
         "optimizer-clip-main-grad", "optimizer-inner-step", "optimizer"};
  if (level >= 2)  // the operations: Megatron's, then the MoE layers' (moecore's names)
    for (const char* s : {"batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send",
                          "backward-recv", "backward-send", "moe-dispatch-all-to-all", "moe-combine-all-to-all",
                          "moe-dispatch-all-gather", "moe-combine-reduce-scatter", "moe-expert-compute"})
      n.emplace_back(s);
  return n;
}

std::vector<TimerRow> gather_timers(Timers& timers, const std::vector<std::string>& names,
                                    const comm::ProcessGroup* world, double normalizer, bool reset) {
  const int64_t n = static_cast<int64_t>(names.size());
  const int64_t ranks = world ? world->size() : 1;
  if (n == 0) return {};
  Tensor mine = Tensor::empty({1, n}, DType::F64);
  for (int64_t i = 0; i < n; i++)
    mine.set_item(i, timers.elapsed(names[static_cast<size_t>(i)], reset) * 1000.0 / normalizer);
  Tensor all = mine;
  if (ranks > 1) {
    all = Tensor::empty({ranks, n}, DType::F64);
    world->all_gather(mine, all);
  }
  std::vector<TimerRow> rows;
  for (int64_t i = 0; i < n; i++) {
    TimerRow r{names[static_cast<size_t>(i)], 0, 0, {}};
    bool any = false;
    for (int64_t k = 0; k < ranks; k++) {
      const double ms = all.item(k * n + i);
      r.rank_ms.push_back(ms);
      if (ms <= 0) continue;  // this rank never ran it (Megatron filters zeros too)
      r.min_ms = any ? std::min(r.min_ms, ms) : ms;
      r.max_ms = any ? std::max(r.max_ms, ms) : ms;
      any = true;
    }
    if (any) rows.push_back(std::move(r));
  }
  return rows;
}

std::string format_timers(const std::vector<TimerRow>& rows, const std::string& option) {
  if (rows.empty()) return "";
  auto dotted = [](const std::string& name) {
    std::string s = name + ' ';
    if (s.size() < 48) s.append(48 - s.size(), '.');
    return s;
  };
  std::string s;
  if (option == "all") {
    s = "times across ranks (ms):";
    for (const auto& r : rows) {
      s += fmt::format("\n  {}:", r.name);
      for (size_t k = 0; k < r.rank_ms.size(); k++)
        if (r.rank_ms[k] > 0) s += fmt::format("\n     rank {:2d}: {:.2f}", k, r.rank_ms[k]);
    }
    return s;
  }
  const bool max_only = option == "max";
  s = max_only ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):";
  for (const auto& r : rows)
    s += max_only ? fmt::format("\n    {}: {:.2f}", dotted(r.name), r.max_ms)
                  : fmt::format("\n    {}: ({:.2f}, {:.2f})", dotted(r.name), r.min_ms, r.max_ms);
  return s;
}

nlohmann::json timers_record(const std::vector<TimerRow>& rows, const std::string& option, int64_t iteration) {
  nlohmann::json t = nlohmann::json::object();
  for (const auto& r : rows) {
    nlohmann::json v = {{"min_ms", r.min_ms}, {"max_ms", r.max_ms}};
    if (option == "all") v["rank_ms"] = r.rank_ms;
    t[r.name] = v;
  }
  return {{"timers", t}, {"iteration", iteration}, {"timing_log_option", option}};
}

}  // namespace moecore::train
