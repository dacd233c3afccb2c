// libFuzzer target: `moecore train --config FILE.yaml`: the YAML layer (parse_flags) and composing the
// configuration from it (compose_train_config: flag values converted, presets, defaults resolved). Input: the
// YAML file's bytes. A moecore::Error is the expected answer to garbage; anything else is a bug.
#include <cstdint>

#include "fuzz_util.h"
#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/start_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = moecore::fuzz::scratch_dir("fuzz_yaml_config") / "c.yaml";
  moecore::fuzz::write(path, reinterpret_cast<const char*>(data), size);
  try {
    const auto flags = moecore::train::parse_flags({"--config", path.string()});
    (void)moecore::train::compose_train_config(flags);
  } catch (const moecore::Error&) {
  }
  return 0;
}
