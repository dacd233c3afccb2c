// libFuzzer target: the safetensors reader (header length, JSON header, dtype/shape/offset validation) and reads
// of every tensor it accepts. Input: the file's bytes. A moecore::Error is the expected answer to garbage;
// anything else (a crash, an ASan or UBSan report, another exception) is a bug.
#include <cstdint>

#include "fuzz_util.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = moecore::fuzz::scratch_dir("fuzz_safetensors") / "t.safetensors";
  moecore::fuzz::write(path, reinterpret_cast<const char*>(data), size);
  try {
    const moecore::ckpt::SafetensorsFile f(path.string());
    for (const auto& [name, entry] : f.entries()) (void)f.read(name);
  } catch (const moecore::Error&) {
  }
  return 0;
}
