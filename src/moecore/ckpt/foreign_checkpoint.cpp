// Megatron-LM's checkpoint layouts recognised by their files (see foreign_checkpoint.h). Megatron writes
// <root>/latest_checkpointed_iteration.txt and <root>/iter_0000100/ as moecore does; inside, torch_dist and zarr
// put metadata.json (its "sharded_backend" names the format) and common.pt, torch.distributed.checkpoint formats a
// .metadata file and <rank>.distcp shards, the legacy torch format mp_rank_XX[_PPP][_EEE]/model_optim_rng.pt.
#include "moecore/ckpt/foreign_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "moecore/core/error.h"

namespace moecore::ckpt {

namespace fs = std::filesystem;

namespace {

// metadata.json's "sharded_backend" (torch_dist, zarr), or empty.
std::string sharded_backend(const fs::path& file) {
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("sharded_backend") && j["sharded_backend"].is_string()
             ? j["sharded_backend"].get<std::string>()
             : "";
}

// One directory's own files; `shown` names the directory in the description.
std::optional<std::string> describe_dir(const fs::path& dir, const std::string& shown) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::exists(dir / "index.json", ec)) return std::nullopt;  // moecore's own
  std::string backend, legacy;
  bool metadata_json = false, dcp_metadata = false, common = false;
  int64_t distcp = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "metadata.json") {
      metadata_json = true;
      backend = sharded_backend(e.path());
    } else if (name == ".metadata") {
      dcp_metadata = true;
    } else if (name == "common.pt") {
      common = true;
    } else if (name.size() > 7 && name.ends_with(".distcp")) {
      distcp++;
    } else if (name.starts_with("mp_rank_") && fs::exists(e.path() / "model_optim_rng.pt", ec) &&
               (legacy.empty() || name < legacy)) {
      legacy = name;
    }
  }
  if (!legacy.empty())
    return fmt::format("a Megatron-LM torch checkpoint (--ckpt-format torch: {}{}/model_optim_rng.pt)", shown, legacy);
  if (backend.empty() && !dcp_metadata && distcp == 0) return std::nullopt;
  std::vector<std::string> files;
  if (metadata_json) files.push_back("metadata.json");
  if (dcp_metadata) files.push_back(".metadata");
  if (common) files.push_back("common.pt");
  if (distcp > 0) files.push_back(fmt::format("{} .distcp file{}", distcp, distcp == 1 ? "" : "s"));
  const std::string format = backend.empty()
                                 ? "torch.distributed.checkpoint (Megatron-LM's torch_dist, torch_dcp or fsdp_dtensor)"
                                 : "Megatron-LM " + backend;
  return fmt::format("a {} checkpoint ({} with {})", format, shown, fmt::join(files, ", "));
}

}  // namespace

std::optional<std::string> describe_foreign_checkpoint(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const fs::path p(path);
  if (auto d = describe_dir(p, p.filename().string() + "/")) return d;  // an iteration directory itself
  // A root: its iteration directories, newest first.
  static const std::regex iteration(R"(iter_\d{7,}|release)");
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (fs::is_directory(p, ec))
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.is_directory(ec) && std::regex_match(e.path().filename().string(), iteration)) dirs.push_back(e.path());
  std::sort(dirs.rbegin(), dirs.rend());
  for (const fs::path& d : dirs)
    if (auto x = describe_dir(d, d.filename().string() + "/")) return x;
  return std::nullopt;
}

void refuse_foreign_checkpoint(const std::string& path) {
  const std::optional<std::string> found = describe_foreign_checkpoint(path);
  if (!found) return;
  MOE_CHECK(false, "--load {} holds {}, not a moecore checkpoint: moecore reads and writes only its own format. {}",
            path, *found, kMegatronCheckpointWayIn);
}

}  // namespace moecore::ckpt
