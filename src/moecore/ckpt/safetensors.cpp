// safetensors reader and writer (see safetensors.h).
#include "moecore/ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "moecore/core/progress.h"
#include "moecore/core/timer.h"

namespace moecore::ckpt {

namespace {
constexpr int64_t kMaxHeader = 100 * 1024 * 1024;  // the format's own limit

bool parse_dtype(const std::string& s, DType& out, bool& f8) {
  f8 = s == "F8_E4M3";
  if (f8) {
    out = DType::F32;
    return true;
  }
  static const std::pair<const char*, DType> table[] = {{"F32", DType::F32}, {"F64", DType::F64}, {"BF16", DType::BF16},
                                                        {"F16", DType::F16}, {"I32", DType::I32}, {"I64", DType::I64}};
  for (const auto& [n, t] : table)
    if (s == n) {
      out = t;
      return true;
    }
  return false;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;
      ::close(fd);
      std::remove(path.c_str());  // never a truncated file under the final name
      MOE_CHECK(false, "cannot write {}: {}", path, std::strerror(err));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}
}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& progress) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  int64_t off = 0;
  for (const auto& t : tensors) {
    MOE_ASSERT_MSG(t.tensor.defined() && t.name != "__metadata__", "cannot store tensor '{}'", t.name);
    std::vector<int64_t> shape;
    for (int d = 0; d < t.tensor.ndim(); d++) shape.push_back(t.tensor.dim(d));
    const int64_t n = static_cast<int64_t>(t.tensor.nbytes());
    h[t.name] = {{"dtype", safetensors_dtype(t.tensor.dtype())}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data section 8-byte aligned
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MOE_CHECK(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  write_all(fd, len, 8, path);
  write_all(fd, header.data(), header.size(), path);
  std::optional<Progress> bar;
  if (!progress.empty()) bar.emplace(progress, off, "MB/s", 1e6);
  const double t0 = now_seconds();
  int64_t written = 0;
  for (const auto& t : tensors) {
    write_all(fd, t.tensor.raw(), t.tensor.nbytes(), path);
    written += static_cast<int64_t>(t.tensor.nbytes());
    if (bar) bar->update(written, fmt::format("{} tensors", tensors.size()));
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    std::remove(path.c_str());
    MOE_CHECK(false, "cannot fsync {}: {}", path, std::strerror(err));
  }
  if (::close(fd) != 0) {
    const int err = errno;
    std::remove(path.c_str());
    MOE_CHECK(false, "cannot close {}: {}", path, std::strerror(err));
  }
  const double s = now_seconds() - t0;
  if (bar)
    bar->finish_if_shown(fmt::format("{:.1f} MB in {:.1f} s ({:.2f} MB/s) to {}", static_cast<double>(off) / 1e6, s,
                                     static_cast<double>(off) / 1e6 / std::max(s, 1e-9), path));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MOE_CHECK(f != nullptr, "cannot open {}: {}", path, std::strerror(errno));
  std::fseek(f, 0, SEEK_END);
  file_size_ = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  uint8_t len[8] = {};
  const bool got_len = file_size_ >= 8 && std::fread(len, 1, 8, f) == 8;
  if (!got_len) std::fclose(f);
  MOE_CHECK(got_len, "{} is not a safetensors file: {} bytes, too short for the header length", path, file_size_);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (hl > static_cast<uint64_t>(kMaxHeader) || static_cast<int64_t>(hl) > file_size_ - 8) {
    std::fclose(f);
    MOE_CHECK(false, "{} is corrupt or truncated: header length {} but the file has {} bytes", path, hl, file_size_);
  }
  std::string text(hl, '\0');
  const bool got = std::fread(text.data(), 1, hl, f) == hl;
  std::fclose(f);
  MOE_CHECK(got, "{}: cannot read its {}-byte header", path, hl);
  data_start_ = 8 + static_cast<int64_t>(hl);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    MOE_CHECK(false, "{}: the header is not valid JSON ({})", path, e.what());
  }
  MOE_CHECK(h.is_object(), "{}: the header is not a JSON object", path);
  const int64_t data_size = file_size_ - data_start_;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      MOE_CHECK(it->is_object(), "{}: __metadata__ must be an object of strings", path);
      for (auto m = it->begin(); m != it->end(); ++m) {
        MOE_CHECK(m->is_string(), "{}: __metadata__ entry '{}' is not a string", path, m.key());
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& v = *it;
    const std::string& name = it.key();
    MOE_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets") &&
                  v["dtype"].is_string() && v["shape"].is_array() && v["data_offsets"].is_array() &&
                  v["data_offsets"].size() == 2,
              "{}: tensor '{}' needs dtype, shape and data_offsets [begin, end]", path, name);
    SafetensorsEntry e;
    MOE_CHECK(parse_dtype(v["dtype"].get<std::string>(), e.dtype, e.f8_e4m3),
              "{}: tensor '{}' has unsupported dtype {}", path, name, v["dtype"].get<std::string>());
    MOE_CHECK(v["shape"].size() <= static_cast<size_t>(Shape::kMaxDims), "{}: tensor '{}' has {} dimensions", path,
              name, v["shape"].size());
    int64_t numel = 1;
    for (const auto& d : v["shape"]) {
      MOE_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() < (int64_t{1} << 40),
                "{}: tensor '{}' has an invalid dimension {}", path, name, d.dump());
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<int64_t>();
    }
    for (const auto& o : v["data_offsets"])
      MOE_CHECK(o.is_number_integer() && o.get<int64_t>() >= 0, "{}: tensor '{}' has an invalid offset {}", path, name,
                o.dump());
    e.begin = v["data_offsets"][0].get<int64_t>();
    e.end = v["data_offsets"][1].get<int64_t>();
    const int64_t element = e.f8_e4m3 ? 1 : static_cast<int64_t>(dtype_size(e.dtype));
    MOE_CHECK(e.begin <= e.end && e.end - e.begin == numel * element,
              "{}: tensor '{}' spans bytes [{}, {}) but {} x {} needs {}", path, name, e.begin, e.end, e.shape.str(),
              v["dtype"].get<std::string>(), numel * element);
    MOE_CHECK(e.end <= data_size, "{} is truncated: tensor '{}' ends at byte {} of a {}-byte data section", path, name,
              e.end, data_size);
    ranges.emplace_back(e.begin, e.end);
    entries_[name] = e;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); i++)
    MOE_CHECK(ranges[i].first >= ranges[i - 1].second, "{}: two tensors overlap at byte {}", path, ranges[i].first);
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const auto it = entries_.find(name);
  MOE_CHECK(it != entries_.end(), "{} has no tensor named '{}'", path_, name);
  Tensor t = Tensor::empty(it->second.shape, it->second.dtype);
  read_into(name, t);
  return t;
}

void SafetensorsFile::read_into(const std::string& name, Tensor& dst) const {
  const auto it = entries_.find(name);
  MOE_CHECK(it != entries_.end(), "{} has no tensor named '{}'", path_, name);
  const SafetensorsEntry& e = it->second;
  const size_t n = static_cast<size_t>(e.end - e.begin);
  MOE_ASSERT(dst.dtype() == e.dtype && dst.numel() == e.shape.numel());
  std::vector<uint8_t> bytes(e.f8_e4m3 ? n : 0);
  const int fd = ::open(path_.c_str(), O_RDONLY);
  MOE_CHECK(fd >= 0, "cannot open {}: {}", path_, std::strerror(errno));
  char* p = e.f8_e4m3 ? reinterpret_cast<char*>(bytes.data()) : static_cast<char*>(dst.raw());
  size_t done = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(fd, p + done, n - done, static_cast<off_t>(data_start_ + e.begin) + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  MOE_CHECK(done == n, "{}: cannot read tensor '{}' (file changed or truncated?)", path_, name);
  if (e.f8_e4m3) {
    float* out = dst.data<float>();
    for (size_t i = 0; i < n; i++) out[i] = f8_e4m3_to_f32(bytes[i]);
  }
}

float f8_e4m3_to_f32(uint8_t b) {
  const int exponent = (b >> 3) & 0xF, mantissa = b & 0x7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 · 2^−6
  return sign * std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);      // (1 + m/8) · 2^(e−7)
}
}  // namespace moecore::ckpt
