// Megatron indexed dataset reader and writer (see indexed_dataset.h).
#include "moecore/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "moecore/core/error.h"
#include "moecore/core/file.h"

namespace moecore::data {

namespace {
constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeader = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
}  // namespace

size_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::U8:
    case IndexDType::I8:
      return 1;
    case IndexDType::I16:
    case IndexDType::U16:
      return 2;
    case IndexDType::I32:
    case IndexDType::F32:
      return 4;
    case IndexDType::I64:
    case IndexDType::F64:
      return 8;
  }
  return 0;
}

IndexDType optimal_index_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::U16 : IndexDType::I32;
}

IndexView parse_index(const uint8_t* d, size_t size, uint64_t bin_size, const std::string& name) {
  MOE_CHECK(size >= kHeader, "{}: truncated index ({} bytes, the header alone is {})", name, size, kHeader);
  MOE_CHECK(std::memcmp(d, kMagic, 9) == 0,
            "{}: not a Megatron indexed dataset index (bad magic; expected \"MMIDIDX\\0\\0\")", name);
  const uint64_t version = load<uint64_t>(d + 9);
  MOE_CHECK(version == 1, "{}: index version {} is not supported (expected 1)", name, version);
  IndexView v;
  const uint8_t code = d[17];
  MOE_CHECK(code >= 1 && code <= 8, "{}: unknown dtype code {} at byte offset 17", name, code);
  v.dtype = static_cast<IndexDType>(code);
  MOE_CHECK(v.dtype != IndexDType::F32 && v.dtype != IndexDType::F64,
            "{}: dtype code {} is a floating type; token datasets hold integers", name, code);
  const uint64_t seq = load<uint64_t>(d + 18), docs = load<uint64_t>(d + 26);
  // Counts must fit the file before anything is multiplied out.
  const uint64_t room = size - kHeader;
  MOE_CHECK(seq <= room / 12 && docs <= room / 8,
            "{}: header claims {} sequences and {} document entries, more than the {} bytes of the file hold", name,
            seq, docs, size);
  const uint64_t need = kHeader + seq * 4 + seq * 8 + docs * 8;
  MOE_CHECK(size == need || size == need + seq,  // + seq: Megatron's optional int8 sequence modes (multimodal)
            "{}: size {} bytes does not match its header ({} sequences, {} document entries need {} bytes)", name, size,
            seq, docs, need);
  MOE_CHECK(size == need, "{}: has per-sequence modes (a multimodal dataset), which moecore does not read", name);
  MOE_CHECK(docs >= 1, "{}: no document indices (at least the leading 0 is required)", name);
  v.sequence_count = static_cast<int64_t>(seq);
  v.document_count = static_cast<int64_t>(docs);
  // The arrays are 4- and 8-byte aligned only if the header keeps them so; mmap gives page alignment and the
  // header is 34 bytes, so they are read through aligned copies when needed.
  v.sequence_lengths = reinterpret_cast<const int32_t*>(d + kHeader);
  v.sequence_pointers = reinterpret_cast<const int64_t*>(d + kHeader + seq * 4);
  v.document_indices = reinterpret_cast<const int64_t*>(d + kHeader + seq * 12);
  const size_t item = index_dtype_size(v.dtype);
  for (uint64_t i = 0; i < seq; i++) {
    const int32_t len = load<int32_t>(d + kHeader + i * 4);
    const int64_t ptr = load<int64_t>(d + kHeader + seq * 4 + i * 8);
    MOE_CHECK(len >= 0, "{}: sequence {} has negative length {}", name, i, len);
    MOE_CHECK(ptr >= 0 && static_cast<uint64_t>(ptr) <= bin_size &&
                  static_cast<uint64_t>(len) * item <= bin_size - static_cast<uint64_t>(ptr),
              "{}: sequence {} (offset {}, {} tokens of {} bytes) runs past the end of the .bin ({} bytes); the .bin "
              "is truncated or belongs to another index",
              name, i, ptr, len, item, bin_size);
  }
  int64_t prev = -1;
  for (uint64_t i = 0; i < docs; i++) {
    const int64_t di = load<int64_t>(d + kHeader + seq * 12 + i * 8);
    MOE_CHECK(di >= prev && di >= 0 && static_cast<uint64_t>(di) <= seq,
              "{}: document index {} is {} (must be non-decreasing within [0, {}])", name, i, di, seq);
    prev = di;
  }
  MOE_CHECK(load<int64_t>(d + kHeader + seq * 12) == 0, "{}: document indices must start at 0", name);
  MOE_CHECK(static_cast<uint64_t>(prev) == seq, "{}: the last document index is {} but there are {} sequences", name,
            prev, seq);
  return v;
}

namespace {
void* map_file(const std::string& path, size_t& size, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MOE_CHECK(fd >= 0, "cannot open {} {}: {}", what, path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (size > 0) {
    p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      MOE_CHECK(false, "cannot map {} {}: {}", what, path, std::strerror(errno));
    }
  }
  ::close(fd);
  return p;
}
}  // namespace

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  MOE_CHECK(std::filesystem::exists(idx),
            "dataset index {} does not exist (--data-path takes the prefix without "
            ".bin/.idx)",
            idx);
  MOE_CHECK(std::filesystem::exists(bin), "dataset file {} does not exist next to its index", bin);
  idx_map_ = map_file(idx, idx_size_, "dataset index");
  bin_map_ = map_file(bin, bin_size_, "dataset");
  try {
    static const uint8_t empty = 0;
    idx_ = parse_index(idx_map_ ? static_cast<const uint8_t*>(idx_map_) : &empty, idx_size_, bin_size_, idx);
  } catch (...) {
    if (idx_map_) ::munmap(idx_map_, idx_size_);
    if (bin_map_) ::munmap(bin_map_, bin_size_);
    throw;
  }
}

IndexedDataset::IndexedDataset(const uint8_t* idx, size_t idx_size, const uint8_t* bin, size_t bin_size,
                               const std::string& name)
    : prefix_(name),
      idx_map_(const_cast<uint8_t*>(idx)),
      idx_size_(idx_size),
      bin_map_(const_cast<uint8_t*>(bin)),
      bin_size_(bin_size),
      owns_maps_(false) {
  idx_ = parse_index(idx, idx_size, bin_size, name + ".idx");
}

IndexedDataset::~IndexedDataset() {
  if (!owns_maps_) return;
  if (idx_map_) ::munmap(idx_map_, idx_size_);
  if (bin_map_) ::munmap(bin_map_, bin_size_);
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  MOE_ASSERT(i >= 0 && i < idx_.sequence_count);
  return load<int32_t>(reinterpret_cast<const uint8_t*>(idx_.sequence_lengths + i));
}

int64_t IndexedDataset::document_index(int64_t i) const {
  MOE_ASSERT(i >= 0 && i < idx_.document_count);
  return load<int64_t>(reinterpret_cast<const uint8_t*>(idx_.document_indices + i));
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int64_t* out) const {
  MOE_ASSERT(i >= 0 && i < idx_.sequence_count);
  const int64_t len = load<int32_t>(reinterpret_cast<const uint8_t*>(idx_.sequence_lengths + i));
  MOE_ASSERT(offset >= 0 && length >= 0 && offset + length <= len);
  const int64_t ptr = load<int64_t>(reinterpret_cast<const uint8_t*>(idx_.sequence_pointers + i));
  const size_t item = index_dtype_size(idx_.dtype);
  const uint8_t* p = static_cast<const uint8_t*>(bin_map_) + ptr + offset * static_cast<int64_t>(item);
  for (int64_t k = 0; k < length; k++, p += item) {
    switch (idx_.dtype) {
      case IndexDType::U8:
        out[k] = *p;
        break;
      case IndexDType::I8:
        out[k] = static_cast<int8_t>(*p);
        break;
      case IndexDType::I16:
        out[k] = load<int16_t>(p);
        break;
      case IndexDType::U16:
        out[k] = load<uint16_t>(p);
        break;
      case IndexDType::I32:
        out[k] = load<int32_t>(p);
        break;
      case IndexDType::I64:
        out[k] = load<int64_t>(p);
        break;
      default:
        MOE_ASSERT(false);
    }
  }
}

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& bin_path, IndexDType dtype)
    : bin_path_(bin_path), bin_tmp_(bin_path + ".tmp"), dtype_(dtype) {
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  MOE_CHECK(bin_ != nullptr, "cannot create {}: {}", bin_tmp_, std::strerror(errno));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) {  // not finalized: drop the partial output
    std::fclose(bin_);
    std::remove(bin_tmp_.c_str());
  }
}

void IndexedDatasetBuilder::add_document(const std::vector<int32_t>& tokens, const std::vector<int32_t>& lengths) {
  int64_t total = 0;
  for (int32_t l : lengths) total += l;
  MOE_ASSERT(total == static_cast<int64_t>(tokens.size()));
  const size_t item = index_dtype_size(dtype_);
  buf_.resize(tokens.size() * item);
  for (size_t i = 0; i < tokens.size(); i++) {
    const int32_t t = tokens[i];
    switch (dtype_) {
      case IndexDType::U16: {
        MOE_ASSERT(t >= 0 && t <= 0xFFFF);
        const uint16_t v = static_cast<uint16_t>(t);
        std::memcpy(&buf_[i * 2], &v, 2);
        break;
      }
      case IndexDType::I32:
        std::memcpy(&buf_[i * 4], &t, 4);
        break;
      case IndexDType::I64: {
        const int64_t v = t;
        std::memcpy(&buf_[i * 8], &v, 8);
        break;
      }
      default:
        MOE_ASSERT_MSG(false, "builder writes u16, i32 or i64 tokens");
    }
  }
  if (!buf_.empty())
    MOE_CHECK(std::fwrite(buf_.data(), 1, buf_.size(), bin_) == buf_.size(), "cannot write {}: {}", bin_tmp_,
              std::strerror(errno));
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  doc_idx_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::finalize(const std::string& idx_path) {
  const bool flushed = std::fflush(bin_) == 0 && ::fsync(fileno(bin_)) == 0;
  const int flush_err = errno;
  const bool closed = std::fclose(bin_) == 0;
  bin_ = nullptr;
  if (!flushed || !closed) std::remove(bin_tmp_.c_str());
  MOE_CHECK(flushed && closed, "cannot write {}: {}", bin_tmp_, std::strerror(flushed ? errno : flush_err));
  const std::string idx_tmp = idx_path + ".tmp";
  std::FILE* f = std::fopen(idx_tmp.c_str(), "wb");
  MOE_CHECK(f != nullptr, "cannot create {}: {}", idx_tmp, std::strerror(errno));
  const uint64_t version = 1, seq = lengths_.size(), docs = doc_idx_.size();
  const uint8_t code = static_cast<uint8_t>(dtype_);
  std::vector<int64_t> ptrs(seq);
  int64_t p = 0;
  for (size_t i = 0; i < seq; i++) {
    ptrs[i] = p;
    p += static_cast<int64_t>(lengths_[i]) * static_cast<int64_t>(index_dtype_size(dtype_));
  }
  bool ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 &&
            std::fwrite(&code, 1, 1, f) == 1 && std::fwrite(&seq, 8, 1, f) == 1 && std::fwrite(&docs, 8, 1, f) == 1;
  ok = ok && (seq == 0 || std::fwrite(lengths_.data(), 4, seq, f) == seq);
  ok = ok && (seq == 0 || std::fwrite(ptrs.data(), 8, seq, f) == seq);
  ok = ok && std::fwrite(doc_idx_.data(), 8, docs, f) == docs;
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {  // a full disk: the previous .bin/.idx (if any) stay as they were
    std::remove(idx_tmp.c_str());
    std::remove(bin_tmp_.c_str());
  }
  MOE_CHECK(ok, "cannot write {}: {}", idx_tmp, std::strerror(err != 0 ? err : errno));
  rename_checked(bin_tmp_, bin_path_);
  rename_checked(idx_tmp, idx_path);
}

}  // namespace moecore::data
