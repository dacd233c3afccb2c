// Megatron-LM's indexed dataset: a .bin of token ids and a .idx describing sequences and documents, byte-compatible
// with megatron/core/datasets/indexed_dataset.py (header "MMIDIDX\0\0", version 1, dtype code, sequence and
// document counts, int32 sequence lengths, int64 byte pointers, int64 document indices). Read by mmap; every
// field is validated against the file sizes before use, so a corrupt or truncated file is named, never followed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace moecore::data {

// Megatron's DType codes.
enum class IndexDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };
size_t index_dtype_size(IndexDType t);
// Megatron's DType.optimal_dtype: uint16 below 65500 distinct tokens, else int32.
IndexDType optimal_index_dtype(int64_t vocab_size);

// A parsed .idx (views into its bytes).
struct IndexView {
  IndexDType dtype = IndexDType::U16;
  int64_t sequence_count = 0;
  int64_t document_count = 0;  // entries of document_indices (= documents + 1)
  const int32_t* sequence_lengths = nullptr;
  const int64_t* sequence_pointers = nullptr;
  const int64_t* document_indices = nullptr;
};

// Validates and parses .idx bytes for a .bin of `bin_size` bytes; `name` is used in error messages.
IndexView parse_index(const uint8_t* data, size_t size, uint64_t bin_size, const std::string& name);

class IndexedDataset {
 public:
  // Opens {prefix}.idx and {prefix}.bin.
  explicit IndexedDataset(const std::string& prefix);
  // Over .idx and .bin bytes already in memory (not owned; they must outlive the dataset).
  IndexedDataset(const uint8_t* idx, size_t idx_size, const uint8_t* bin, size_t bin_size, const std::string& name);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  int64_t num_sequences() const { return idx_.sequence_count; }
  int64_t num_documents() const { return idx_.document_count - 1; }
  // The arrays start at byte 34 of the .idx, so they are read with unaligned loads.
  int64_t sequence_length(int64_t i) const;
  int64_t document_index(int64_t i) const;  // i in [0, num_documents()]
  IndexDType dtype() const { return idx_.dtype; }
  const std::string& prefix() const { return prefix_; }
  // Copies tokens [offset, offset + length) of sequence i into out (as int64).
  void read(int64_t i, int64_t offset, int64_t length, int64_t* out) const;

 private:
  std::string prefix_;
  void* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  void* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  bool owns_maps_ = true;
  IndexView idx_;
};

// Writes a .bin/.idx pair as Megatron's IndexedDatasetBuilder does. Files are written under temporary names and
// renamed by finalize(), so an interrupted run leaves no half-written dataset.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& bin_path, IndexDType dtype);
  ~IndexedDatasetBuilder();
  // One document: its tokens, split into sequences of the given lengths (their sum is tokens.size()).
  void add_document(const std::vector<int32_t>& tokens, const std::vector<int32_t>& lengths);
  void finalize(const std::string& idx_path);

 private:
  std::string bin_path_, bin_tmp_;
  IndexDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<char> buf_;
};

}  // namespace moecore::data
