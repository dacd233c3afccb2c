// libFuzzer target: the metadata of a checkpoint as `--load` reads it: the latest marker and train_state.json
// (find_checkpoint), then index.json (read_model_index). Thin on purpose: it goes through the public functions
// only, so the readers can change underneath. Input: marker, state and index texts separated by NUL bytes; they
// are written to <root>/latest_checkpointed_iteration.txt and to train_state.json and index.json in both
// <root>/iter_0000001 and <root>/release. A moecore::Error is the expected answer to garbage; anything else is a
// bug.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const fs::path& root = moecore::fuzz::scratch_dir("fuzz_checkpoint_metadata");
  std::string_view rest(reinterpret_cast<const char*>(data), size), parts[3];
  for (auto& part : parts) {
    const size_t nul = rest.find('\0');
    part = rest.substr(0, nul);
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  }
  moecore::fuzz::write(root / moecore::ckpt::kLatestFile, parts[0].data(), parts[0].size());
  for (const char* iter : {"iter_0000001", "release"}) {
    fs::create_directories(root / iter);
    moecore::fuzz::write(root / iter / moecore::ckpt::kStateFile, parts[1].data(), parts[1].size());
    moecore::fuzz::write(root / iter / "index.json", parts[2].data(), parts[2].size());
  }
  try {
    if (const auto found = moecore::ckpt::find_checkpoint(root.string()))
      (void)moecore::ckpt::read_model_index(found->dir);
  } catch (const moecore::Error&) {
  }
  try {
    (void)moecore::ckpt::read_model_index((root / "iter_0000001").string());
  } catch (const moecore::Error&) {
  }
  return 0;
}
