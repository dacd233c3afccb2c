// libFuzzer target: the .idx parser and reads through it. Input: 4 bytes of .bin size (little endian, capped at
// 64 KiB) followed by the .idx bytes. A moecore::Error is the expected answer to garbage; anything else
// (a crash, an out-of-bounds read under ASan, another exception) is a bug.
#include <cstdint>
#include <cstring>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t bin_size;
  std::memcpy(&bin_size, data, 4);
  bin_size &= 0xFFFF;
  std::vector<uint8_t> bin(bin_size, 0x5A);
  try {
    moecore::data::IndexedDataset ds(data + 4, size - 4, bin.data(), bin.size(), "fuzz");
    std::vector<int64_t> buf;
    for (int64_t i = 0; i < ds.num_sequences(); i++) {
      buf.resize(static_cast<size_t>(ds.sequence_length(i)));
      ds.read(i, 0, ds.sequence_length(i), buf.data());
    }
    for (int64_t d = 0; d <= ds.num_documents(); d++) (void)ds.document_index(d);
  } catch (const moecore::Error&) {
  }
  return 0;
}
