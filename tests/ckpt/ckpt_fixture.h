// Shared by the checkpoint-metadata and I/O-error tests: a tiny MoE training configuration, a directory of real
// checkpoints, and a digest of every file under a directory (to prove that nothing was lost or overwritten).
#pragma once

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config_util.h"
#include "moecore/core/file.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore::testing {

// A fresh temporary path of this process: CTest runs the tests of one file in parallel processes.
inline std::string own_temp_path(const std::string& name) {
  return fresh_temp_path(name + "_" + std::to_string(::getpid()));
}

inline train::TrainConfig ckpt_config(const std::vector<std::string>& extra) {
  return small_config(tiny_moe_flags() + mock_run_flags(16, 2, 4, 100, 8, "3e-3"), extra);
}

// A fresh `root` holding the complete checkpoints of one run at each of `iterations` (ascending).
inline void make_checkpoints(const std::string& root, const std::vector<int64_t>& iterations) {
  NullOut null;
  train::Trainer t(ckpt_config({"--save", root}), null.f, false);
  for (int64_t it : iterations) {
    while (t.iteration() < it) t.train_step();
    t.save_checkpoint();
  }
}

// Path (relative to `root`) -> XXH3-64 of the content, for every regular file below `root`.
inline std::map<std::string, uint64_t> digest(const std::string& root) {
  std::map<std::string, uint64_t> d;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::string bytes = read_file(e.path().string(), "test file");
    d[std::filesystem::relative(e.path(), root).string()] = XXH3_64bits(bytes.data(), bytes.size());
  }
  return d;
}

}  // namespace moecore::testing
