// Reading a metrics JSON-lines file back (see run_history.h).
#include "moecore/report/run_history.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "moecore/core/error.h"
#include "moecore/core/file.h"

namespace moecore::report {

std::string default_run_name(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string stem = p.stem().string();
  if (stem == "metrics" && p.has_parent_path() && !p.parent_path().filename().empty())
    return p.parent_path().filename().string();
  return stem.empty() ? path : stem;
}

RunHistory read_run_history(const std::string& path, const std::string& name) {
  const std::string text = read_file(path, "metrics file");
  RunHistory h;
  h.name = name;
  h.path = path;
  std::map<int64_t, nlohmann::json> train, valid;  // by iteration
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const bool complete = end != std::string::npos;
    if (!complete) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    line_no++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() && !complete) {  // the run died while writing its last line
      h.skipped_lines++;
      continue;
    }
    MOE_CHECK(j.is_object(), "{} line {}: not a JSON object (is this a --metrics-file of moecore train?)", path,
              line_no);
    const auto it = j.find("iteration");
    MOE_CHECK(it != j.end() && it->is_number_integer(), "{} line {}: no integer \"iteration\" field", path, line_no);
    const int64_t iteration = it->get<int64_t>();
    if (j.contains("alarm")) {  // a health alarm's record (train/routing_health.cpp), between the log lines
      h.alarms.push_back(std::move(j));
      continue;
    }
    if (j.contains("timers")) {  // the timers after a log line (train/timers.cpp), their own record
      h.timers.push_back(std::move(j));
      continue;
    }
    if (j.contains("eval")) {
      valid[iteration] = std::move(j);
      continue;
    }
    // A resumed run starts again after its checkpoint: what the interrupted run logged from there on is replaced.
    if (!train.empty() && iteration <= train.rbegin()->first) {
      train.erase(train.lower_bound(iteration), train.end());
      valid.erase(valid.lower_bound(iteration), valid.end());
    }
    train[iteration] = std::move(j);
  }
  MOE_CHECK(!train.empty() || !valid.empty(), "{}: no metrics lines (did the run reach its first --log-interval?)",
            path);
  for (auto& [i, j] : train) h.train.push_back(std::move(j));
  for (auto& [i, j] : valid) h.valid.push_back(std::move(j));
  return h;
}

}  // namespace moecore::report
