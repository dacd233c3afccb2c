// libFuzzer target: a HuggingFace config.json as `--load-hf` reads it (apply_hf_config: JSON, the architecture's
// training flags, applying them to a TrainConfig) and as `moecore convert` reads it (hf_architecture). Input: the
// file's bytes. A moecore::Error is the expected answer to garbage; anything else is a bug.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "moecore/ckpt/hf.h"
#include "moecore/core/error.h"
#include "moecore/train/config/start_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& dir = moecore::fuzz::scratch_dir("fuzz_hf_config");
  moecore::fuzz::write(dir / "config.json", reinterpret_cast<const char*>(data), size);
  try {
    moecore::train::TrainConfig c;
    moecore::train::apply_hf_config(c, dir.string());
  } catch (const moecore::Error&) {
  }
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;  // apply_hf_config above reported it as a moecore::Error
  try {
    (void)moecore::ckpt::hf_architecture(j, "config.json");
  } catch (const moecore::Error&) {
  }
  return 0;
}
