// Checkpoint directories, atomic saves and the latest marker (see manager.h).
#include "moecore/ckpt/manager.h"

#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "moecore/core/error.h"
#include "moecore/core/file.h"

namespace moecore::ckpt {

namespace fs = std::filesystem;

std::string iteration_dir(const std::string& root, int64_t iteration) {
  return iteration < 0 ? root + "/release" : fmt::format("{}/iter_{:07d}", root, iteration);
}

namespace {
void barrier(const comm::ProcessGroup* world) {
  if (world && world->size() > 1) world->barrier();
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t iteration, const std::vector<StoredTensor>& mine,
                            const nlohmann::json& state, const comm::ProcessGroup* world,
                            const std::vector<std::pair<std::string, std::string>>& extra_files, SaveFault fault) {
  const int64_t rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  const std::string final_dir = iteration_dir(root, iteration), tmp = final_dir + ".tmp";
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    MOE_CHECK(!ec, "cannot create the --save directory {}: {}", root, ec.message());
    fs::remove_all(tmp, ec);  // a save that crashed before
    fs::create_directory(tmp, ec);
    MOE_CHECK(!ec, "cannot create {}: {}", tmp, ec.message());
  }
  barrier(world);
  write_shards(tmp, rank, mine);
  if (fault.rank == rank && fault.iteration == iteration) std::raise(SIGKILL);  // --fault-kill-during-save
  barrier(world);                                                               // every rank's files are on disk
  if (rank == 0) {
    write_model_index(tmp, size);  // refuses any missing or duplicated element
    write_file_durable(tmp + "/" + kStateFile, state.dump(1) + "\n");
    for (const auto& [name, content] : extra_files) write_file_durable(tmp + "/" + name, content);
    fsync_dir(tmp);
    std::error_code ec;
    if (fs::exists(final_dir)) {
      // Saving an iteration again (e.g. resumed from it): the old copy goes only once the new one is complete.
      fs::remove_all(final_dir + ".old", ec);
      fs::rename(final_dir, final_dir + ".old", ec);
      MOE_CHECK(!ec, "cannot move the previous {} aside: {}", final_dir, ec.message());
    }
    fs::rename(tmp, final_dir, ec);
    MOE_CHECK(!ec, "cannot rename {} to {}: {}", tmp, final_dir, ec.message());
    fsync_dir(root);
    const std::string marker = root + "/" + kLatestFile;
    write_file_durable(marker + ".tmp", iteration < 0 ? "release" : std::to_string(iteration));
    fs::rename(marker + ".tmp", marker, ec);
    MOE_CHECK(!ec, "cannot update {}: {}", marker, ec.message());
    fsync_dir(root);
    fs::remove_all(final_dir + ".old", ec);
  }
  barrier(world);
  return final_dir;
}

std::optional<FoundCheckpoint> find_checkpoint(const std::string& path) {
  std::string dir;
  const std::string marker = path + "/" + kLatestFile;
  if (fs::exists(marker)) {
    std::string text = moecore::read_file(marker, "checkpoint marker");
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    int64_t it = -1;
    if (text != "release") {
      size_t pos = 0;
      try {
        it = std::stoll(text, &pos);
      } catch (...) {
        pos = 0;
      }
      MOE_CHECK(pos == text.size() && pos > 0 && it >= 0,
                "{} is corrupt: expected an iteration number or 'release', found '{}'", marker, text);
    }
    dir = iteration_dir(path, it);
    // A crash while re-saving the same iteration can leave only the previous copy, moved aside.
    if (!fs::exists(dir + "/index.json") && fs::exists(dir + ".old/index.json")) dir += ".old";
    MOE_CHECK(fs::exists(dir + "/index.json"),
              "{} names {}, which is missing or incomplete; restore it or point --load at another iteration "
              "directory",
              marker, dir);
  } else if (fs::exists(path + "/index.json")) {
    dir = path;
  } else {
    return std::nullopt;
  }
  FoundCheckpoint f{dir, {}};
  const std::string sp = dir + "/" + kStateFile;
  MOE_CHECK(fs::exists(sp), "{} has no {}: the checkpoint is incomplete", dir, kStateFile);
  try {
    f.state = nlohmann::json::parse(moecore::read_file(sp, "checkpoint state"));
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "{} is not valid JSON ({}): the checkpoint is corrupt", sp, e.what());
  }
  MOE_CHECK(f.state.is_object() && f.state.value("format", nlohmann::json()) == "moecore-train-state-1",
            "{} is not a moecore training state (format moecore-train-state-1)", sp);
  return f;
}

}  // namespace moecore::ckpt
