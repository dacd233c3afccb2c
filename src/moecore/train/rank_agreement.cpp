// Ranks agree before work (see rank_agreement.h). Protocol: all-gather one 64-bit hash per rank (fixed size, so
// no rank can truncate another's message); only when they differ, all-gather each rank's (what, value) list
// (lengths first, then the bytes) and compare every rank with rank 0, entry by entry. Every rank takes the same
// branch and builds the same message.
#include "moecore/train/rank_agreement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"

namespace moecore::train {

namespace {

std::string file_size(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? "missing" : fmt::format("{} bytes", n);
}

bool is_number(const std::string& s) {
  try {
    size_t pos = 0;
    std::stod(s, &pos);
    return pos == s.size();
  } catch (...) {
    return false;
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> run_identity(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> id;
  const nlohmann::json flags = config_json(c);
  for (const auto& f : flag_table()) id.emplace_back("--" + f.name, flags[f.name].dump());
  for (const auto& p : c.data_path) {  // prefixes, or weight/prefix pairs
    if (is_number(p)) continue;
    for (const char* ext : {".bin", ".idx"}) id.emplace_back("dataset file " + p + ext, file_size(p + ext));
  }
  if (!c.load.empty()) {
    std::string what;
    try {  // a broken checkpoint is reported later by the load itself, on every rank alike
      const auto found = ckpt::find_checkpoint(c.load, c.ckpt_step);
      what = found ? fmt::format("{} at iteration {}", found->dir, found->state.value("iteration", int64_t{-1}))
                   : "none (start from scratch)";
    } catch (const std::exception& e) {
      what = fmt::format("unreadable ({})", e.what());
    }
    id.emplace_back("checkpoint in --load", what);
  }
  return id;
}

void check_ranks_agree(const TrainConfig& c, const comm::ProcessGroup& world) {
  const int64_t n = world.size();
  if (n <= 1) return;
  const auto id = run_identity(c);
  const std::string text = nlohmann::json(id).dump();
  Tensor h = Tensor::empty({1}, DType::I64), all = Tensor::empty({n}, DType::I64);
  h.data<int64_t>()[0] = static_cast<int64_t>(XXH64(text.data(), text.size(), 0));
  world.all_gather(h, all);
  const int64_t* hashes = all.data<int64_t>();
  bool same = true;
  for (int64_t r = 1; r < n; r++) same = same && hashes[r] == hashes[0];
  if (same) return;

  // They differ: every rank gets every rank's list (one int32 per byte keeps it to the collectives we have).
  Tensor len = Tensor::empty({1}, DType::I64), lens = Tensor::empty({n}, DType::I64);
  len.data<int64_t>()[0] = static_cast<int64_t>(text.size());
  world.all_gather(len, lens);
  std::vector<int64_t> rows(static_cast<size_t>(n));
  int64_t total = 0;
  for (int64_t r = 0; r < n; r++) total += rows[static_cast<size_t>(r)] = lens.data<int64_t>()[r];
  Tensor mine = Tensor::empty({static_cast<int64_t>(text.size())}, DType::I32),
         bytes = Tensor::empty({total}, DType::I32);
  for (size_t i = 0; i < text.size(); i++) mine.data<int32_t>()[i] = static_cast<unsigned char>(text[i]);
  world.all_gather_v(mine, bytes, rows);
  std::vector<std::vector<std::pair<std::string, std::string>>> ids;
  int64_t at = 0;
  for (int64_t r = 0; r < n; r++) {
    std::string s(static_cast<size_t>(rows[static_cast<size_t>(r)]), ' ');
    for (auto& ch : s) ch = static_cast<char>(bytes.data<int32_t>()[at++]);
    ids.push_back(nlohmann::json::parse(s).get<std::vector<std::pair<std::string, std::string>>>());
  }
  // The first entry (in rank 0's order) on which some rank differs from rank 0, and every rank that does.
  const auto& ref = ids[0];
  for (size_t k = 0; k <= ref.size(); k++) {
    std::vector<int64_t> differ;
    std::string other;
    for (int64_t r = 1; r < n; r++) {
      const auto& mine_r = ids[static_cast<size_t>(r)];
      const bool same_k = k < ref.size() ? k < mine_r.size() && mine_r[k] == ref[k] : mine_r.size() == ref.size();
      if (same_k) continue;
      if (differ.empty() && k < mine_r.size())
        other = k < ref.size() && mine_r[k].first == ref[k].first ? mine_r[k].second
                                                                  : mine_r[k].first + " " + mine_r[k].second;
      if (differ.empty() && k >= mine_r.size()) other = "(nothing)";
      differ.push_back(r);
    }
    if (differ.empty()) continue;
    const std::string what = k < ref.size() ? ref[k].first : "the list of dataset files and checkpoint";
    const std::string value0 = k < ref.size() ? ref[k].second : "(shorter)";
    MOE_CHECK(false,
              "ranks disagree before training: {} is {} on rank 0 but {} on rank {} (ranks differing from rank 0 "
              "there: {}). Start every rank with the same flags, data files and checkpoint",
              what, value0, other, differ[0], fmt::join(differ, ", "));
  }
  MOE_ASSERT_MSG(false, "rank hashes differ but their run identities are equal");
}

}  // namespace moecore::train
