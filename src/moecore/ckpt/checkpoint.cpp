// Native checkpoint model state (see checkpoint.h).
#include "moecore/ckpt/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "moecore/ckpt/metadata.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/progress.h"
#include "moecore/core/timer.h"

namespace moecore::ckpt {

namespace {
// The checksum of a tensor's bytes: XXH3-64 (xxHash), fast enough (tens of GB/s) that verifying every shard on
// load costs little next to reading it.
uint64_t checksum_of(const Tensor& t) {
  return XXH3_64bits(t.raw(), t.nbytes());
}

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> v;
  for (int d = 0; d < s.ndim(); d++) v.push_back(s[d]);
  return v;
}
Shape shape_of(const std::vector<int64_t>& v) {
  Shape s;
  for (int64_t d : v) s.push_back(d);
  return s;
}

bool intersect(const Box& a, const Box& b, std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  const int nd = a.global.ndim();
  lo.assign(static_cast<size_t>(nd), 0);
  hi.assign(static_cast<size_t>(nd), 0);
  for (int d = 0; d < nd; d++) {
    const size_t i = static_cast<size_t>(d);
    lo[i] = std::max(a.offset[i], b.offset[i]);
    hi[i] = std::min(a.offset[i] + a.size[d], b.offset[i] + b.size[d]);
    if (lo[i] >= hi[i]) return false;
  }
  return true;
}

// "[a:b, ...]"; a box read from a damaged index may not fit in int64 ("a:a+size" then).
std::string box_str(const Box& b) {
  std::string s = "[";
  for (int d = 0; d < b.size.ndim(); d++) {
    const int64_t off = d < static_cast<int>(b.offset.size()) ? b.offset[static_cast<size_t>(d)] : 0;
    int64_t end = 0;
    s += __builtin_add_overflow(off, b.size[d], &end) ? fmt::format("{}{}:{}+{}", d ? ", " : "", off, off, b.size[d])
                                                      : fmt::format("{}{}:{}", d ? ", " : "", off, end);
  }
  return s + "]";
}

std::string fragment_path(const std::string& dir, int64_t rank) {
  return fmt::format("{}/index_rank{:05d}.json", dir, rank);
}
}  // namespace

Box whole_box(const Shape& s) {
  return Box{s, s, std::vector<int64_t>(static_cast<size_t>(s.ndim()), 0)};
}

Box box_of(const nn::Parameter& p) {
  if (!p.sharded()) return whole_box(p.value.shape());
  return Box{p.global_view, p.box_shape, p.box_offset};
}

bool boxes_intersect(const Box& a, const Box& b) {
  std::vector<int64_t> lo, hi;
  return intersect(a, b, lo, hi);
}

int64_t copy_intersection(const Tensor& src, const Box& sb, Tensor& dst, const Box& db) {
  MOE_ASSERT(src.dtype() == dst.dtype() && sb.global == db.global);
  MOE_ASSERT(src.numel() == sb.volume() && dst.numel() == db.volume());
  std::vector<int64_t> lo, hi;
  if (!intersect(sb, db, lo, hi)) return 0;
  const int nd = sb.global.ndim();
  const size_t es = dtype_size(src.dtype());
  // Walk the intersection row by row along the last dimension.
  const int64_t row = hi.back() - lo.back();
  std::vector<int64_t> idx(lo.begin(), lo.end());
  int64_t copied = 0;
  while (true) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < nd; d++) {
      const size_t i = static_cast<size_t>(d);
      so = so * sb.size[d] + (idx[i] - sb.offset[i]);
      dof = dof * db.size[d] + (idx[i] - db.offset[i]);
    }
    std::memcpy(static_cast<char*>(dst.raw()) + static_cast<size_t>(dof) * es,
                static_cast<const char*>(src.raw()) + static_cast<size_t>(so) * es, static_cast<size_t>(row) * es);
    copied += row;
    int d = nd - 2;
    for (; d >= 0; d--) {
      const size_t i = static_cast<size_t>(d);
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
    }
    if (d < 0) break;
  }
  return copied;
}

StoredTensor stored(const nn::Parameter& p) {
  return {p.name, box_of(p), p.value};
}

void write_shards(const std::string& dir, int64_t rank, const std::vector<StoredTensor>& tensors) {
  const std::string file = fmt::format("model_rank{:05d}.safetensors", rank);
  std::vector<NamedTensor> ts;
  nlohmann::json frag = nlohmann::json::array();
  for (const auto& t : tensors) {
    MOE_ASSERT(t.tensor.numel() == t.box.volume());
    ts.push_back({t.name, t.tensor});
    frag.push_back({{"name", t.name},
                    {"file", file},
                    {"global", dims(t.box.global)},
                    {"offset", t.box.offset},
                    {"size", dims(t.box.size)},
                    {"dtype", safetensors_dtype(t.tensor.dtype())},
                    {"xxh3_64", fmt::format("{:016x}", checksum_of(t.tensor))}});
  }
  write_safetensors(dir + "/" + file, ts, {}, rank == 0 ? "checkpoint save" : "");  // rank 0 shows its files'
  write_file_durable(fragment_path(dir, rank), frag.dump(1) + "\n");
}

void write_model_shards(const std::string& dir, int64_t rank, const std::vector<const nn::Parameter*>& params) {
  std::vector<StoredTensor> ts;
  for (const auto* p : params) ts.push_back(stored(*p));
  write_shards(dir, rank, ts);
}

namespace {
// A list of integers; get<std::vector<int64_t>>() would cast floats, undefined beyond int64's range (fuzzing).
std::vector<int64_t> integers(const nlohmann::json& j) {
  MOE_CHECK(j.is_array(), "not a list: {}", j.dump());
  for (const auto& x : j) MOE_CHECK(x.is_number_integer(), "not an integer: {}", x.dump());
  return j.get<std::vector<int64_t>>();
}

std::vector<ShardRecord> parse_records(const nlohmann::json& j, const std::string& where) {
  std::vector<ShardRecord> out;
  MOE_CHECK(j.is_array(), "{}: expected a list of shards", where);
  for (const auto& e : j) {
    try {
      ShardRecord r;
      r.name = e.at("name").get<std::string>();
      r.file = e.at("file").get<std::string>();
      r.box.global = shape_of(integers(e.at("global")));
      r.box.offset = integers(e.at("offset"));
      r.box.size = shape_of(integers(e.at("size")));
      const std::string dt = e.at("dtype").get<std::string>();
      // f32 parameters and master state, f64 (tests), bf16 Adam moments (--exp-avg-dtype bf16).
      MOE_CHECK(dt == "F32" || dt == "F64" || dt == "BF16", "dtype {}", dt);
      r.dtype = dt == "F32" ? DType::F32 : dt == "F64" ? DType::F64 : DType::BF16;
      const std::string sum = e.at("xxh3_64").get<std::string>();
      size_t used = 0;
      r.checksum = std::stoull(sum, &used, 16);
      MOE_CHECK(used == sum.size() && sum.size() == 16, "checksum {}", sum);
      MOE_CHECK(r.file.find('/') == std::string::npos && r.file.find("..") == std::string::npos, "file {}", r.file);
      out.push_back(r);
    } catch (const std::exception& ex) {
      MOE_CHECK(false, "{}: a shard entry is malformed ({}): {}", where, ex.what(), e.dump());
    }
  }
  return out;
}

// Every problem with how the records tile their global views, one line each (empty: valid).
std::vector<std::string> tiling_problems(const std::vector<ShardRecord>& recs) {
  std::map<std::string, std::vector<const ShardRecord*>> by_name;
  for (const auto& r : recs) by_name[r.name].push_back(&r);
  std::vector<std::string> problems;
  for (const auto& [name, rs] : by_name) {
    const Box& first = rs.front()->box;
    bool consistent = true;
    for (const auto* r : rs) {
      const Box& b = r->box;
      bool ok = b.global == first.global && r->dtype == rs.front()->dtype &&
                static_cast<int>(b.offset.size()) == b.global.ndim() && b.size.ndim() == b.global.ndim();
      for (int d = 0; ok && d < b.global.ndim(); d++) {  // offset + size ≤ global, without overflowing int64
        const int64_t off = b.offset[static_cast<size_t>(d)], size = b.size[d], global = b.global[d];
        ok = off >= 0 && size >= 0 && size <= global && off <= global - size;
      }
      if (!ok) {
        problems.push_back(fmt::format("{}: shard {} in {} does not fit the global shape {} (or its dtype differs)",
                                       name, box_str(b), r->file, first.global.str()));
        consistent = false;
      }
    }
    if (!consistent) continue;
    std::vector<int64_t> lo, hi;
    for (size_t i = 0; i < rs.size(); i++)
      for (size_t j = i + 1; j < rs.size(); j++)
        if (intersect(rs[i]->box, rs[j]->box, lo, hi))
          problems.push_back(fmt::format("{}: duplicated elements: shard {} in {} overlaps shard {} in {}", name,
                                         box_str(rs[i]->box), rs[i]->file, box_str(rs[j]->box), rs[j]->file));
    // Coverage along the first dimension (the expert index for routed experts).
    const int64_t n0 = first.global[0], slab = first.global.numel() / std::max<int64_t>(1, n0);
    std::vector<int64_t> covered(static_cast<size_t>(n0), 0);
    for (const auto* r : rs)
      for (int64_t i = r->box.offset[0]; i < r->box.offset[0] + r->box.size[0]; i++)
        covered[static_cast<size_t>(i)] += r->box.volume() / r->box.size[0];
    std::vector<int64_t> missing;
    for (int64_t i = 0; i < n0; i++)
      if (covered[static_cast<size_t>(i)] < slab) missing.push_back(i);
    if (!missing.empty()) {
      std::string list;
      for (size_t k = 0; k < missing.size() && k < 16; k++) list += (k ? ", " : "") + std::to_string(missing[k]);
      if (missing.size() > 16) list += ", ...";
      problems.push_back(fmt::format("{}: missing elements of global shape {} at index {} of its first dimension{}",
                                     name, first.global.str(), list,
                                     name.find(".experts.") != std::string::npos ? " (experts)" : ""));
    }
  }
  return problems;
}

void throw_problems(const std::string& dir, const std::vector<std::string>& problems) {
  std::string msg =
      fmt::format("checkpoint {} is not usable ({} problem{}):", dir, problems.size(), problems.size() == 1 ? "" : "s");
  for (const auto& p : problems) msg += "\n  " + p;
  MOE_CHECK(false, "{}", msg);
}
}  // namespace

void write_model_index(const std::string& dir, int64_t world) {
  std::vector<ShardRecord> all;
  nlohmann::json merged = nlohmann::json::array();
  std::vector<std::string> problems;
  for (int64_t r = 0; r < world; r++) {
    std::ifstream f(fragment_path(dir, r));
    if (!f.good()) {
      problems.push_back(fmt::format("rank {} wrote no index fragment ({})", r, fragment_path(dir, r)));
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      problems.push_back(fmt::format("{} is not valid JSON ({})", fragment_path(dir, r), e.what()));
      continue;
    }
    for (const auto& rec : parse_records(j, fragment_path(dir, r))) all.push_back(rec);
    for (const auto& e : j) merged.push_back(e);
  }
  for (const auto& p : tiling_problems(all)) problems.push_back(p);
  if (!problems.empty()) throw_problems(dir, problems);
  const std::string tmp = dir + "/index.json.tmp";
  write_file_durable(tmp, metadata_text({{"format", kIndexFormat}, {"shards", merged}}));
  rename_checked(tmp, dir + "/index.json");
  for (int64_t r = 0; r < world; r++) std::filesystem::remove(fragment_path(dir, r));
}

std::vector<ShardRecord> read_model_index(const std::string& dir) {
  const std::string path = dir + "/index.json";
  MOE_CHECK(std::filesystem::exists(path), "{} has no index.json: not a moecore checkpoint, or its save did not finish",
            dir);
  const nlohmann::json j = read_metadata(path, "checkpoint index", {kIndexFormat, kIndexFormatV1});
  MOE_CHECK(j.contains("shards"), "{}: field 'shards' is missing; {}", path, kMetadataFix);
  auto recs = parse_records(j["shards"], path);
  const auto problems = tiling_problems(recs);
  if (!problems.empty()) throw_problems(dir, problems);
  return recs;
}

void load_tensors(const std::string& dir, const std::vector<LoadTarget>& targets) {
  load_tensors(dir, read_model_index(dir), targets);
}

void load_tensors(const std::string& dir, const std::vector<ShardRecord>& recs,
                  const std::vector<LoadTarget>& targets) {
  std::map<std::string, std::vector<const ShardRecord*>> by_name;
  for (const auto& r : recs) by_name[r.name].push_back(&r);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  std::vector<std::string> problems;
  int64_t bytes = 0, done = 0;
  for (const auto& tg : targets) bytes += static_cast<int64_t>(tg.dst->nbytes());
  Progress bar("checkpoint load", bytes, "MB/s", 1e6);  // shown only when the load takes a while
  const double t0 = now_seconds();
  for (const auto& tg : targets) {
    MOE_ASSERT(tg.dst && tg.dst->numel() == tg.box.volume());
    bar.update(done, fmt::format("{} of {} tensors", &tg - targets.data(), targets.size()));
    done += static_cast<int64_t>(tg.dst->nbytes());
    const auto it = by_name.find(tg.name);
    if (it == by_name.end()) {
      problems.push_back(fmt::format("{}: not in the checkpoint", tg.name));
      continue;
    }
    Box mine = tg.box;
    const Shape& theirs = it->second.front()->box.global;
    // Elements of `mine` the checkpoint must provide: all of them, or with a differently padded vocabulary the
    // rows below the checkpoint's row count (both must hold the real vocabulary).
    int64_t expect = mine.volume();
    bool same = theirs == mine.global;
    if (!same && tg.vocab_rows > 0 && theirs.ndim() == mine.global.ndim() && theirs[0] >= tg.vocab_rows &&
        mine.global[0] >= tg.vocab_rows) {
      same = true;
      for (int d = 1; d < theirs.ndim(); d++) same = same && theirs[d] == mine.global[d];
      const int64_t rows = std::clamp<int64_t>(theirs[0] - mine.offset[0], 0, mine.size[0]);
      expect = mine.volume() / std::max<int64_t>(1, mine.size[0]) * rows;
    }
    if (!same) {
      problems.push_back(fmt::format("{}: the checkpoint's global shape {} differs from the model's {}", tg.name,
                                     theirs.str(), mine.global.str()));
      continue;
    }
    int64_t got = 0;
    for (const auto* r : it->second) {
      Box rb = r->box;
      rb.global = mine.global;  // equal, or differing only in vocabulary padding (boxes are absolute)
      std::vector<int64_t> lo, hi;
      if (!intersect(rb, mine, lo, hi)) continue;
      auto& f = files[r->file];
      if (!f) f = std::make_unique<SafetensorsFile>(dir + "/" + r->file);
      // The stored box is the wanted one (same layout): read straight into place.
      const bool in_place =
          r->box.offset == mine.offset && r->box.size == mine.size && r->dtype == tg.dst->dtype() &&
          f->contains(r->name) &&
          f->entries().at(r->name).end - f->entries().at(r->name).begin == static_cast<int64_t>(tg.dst->nbytes());
      Tensor t = in_place ? *tg.dst : f->read(r->name);
      if (in_place) f->read_into(r->name, t);
      if (t.numel() != r->box.volume() || t.dtype() != r->dtype) {
        problems.push_back(fmt::format("{}: {} holds {} {} where the index says {} {}", tg.name, r->file,
                                       t.shape().str(), dtype_name(t.dtype()), r->box.size.str(),
                                       dtype_name(r->dtype)));
        continue;
      }
      if (checksum_of(t) != r->checksum) {
        problems.push_back(fmt::format("{}: checksum mismatch in {} (the file is corrupt)", tg.name, r->file));
        continue;
      }
      if (in_place) {
        got += t.numel();
        continue;
      }
      if (t.dtype() != tg.dst->dtype()) t = t.to(tg.dst->dtype());
      got += copy_intersection(t, rb, *tg.dst, mine);
    }
    if (got != expect && problems.empty())
      problems.push_back(fmt::format("{}: {} of {} elements found", tg.name, got, expect));
  }
  if (!problems.empty()) throw_problems(dir, problems);
  const double s = now_seconds() - t0;
  bar.finish_if_shown(fmt::format("{:.1f} MB in {:.1f} s ({:.2f} MB/s) from {}", static_cast<double>(bytes) / 1e6, s,
                                  static_cast<double>(bytes) / 1e6 / std::max(s, 1e-9), dir));
}

void load_model(const std::string& dir, nn::ParamRegistry& reg) {
  std::vector<LoadTarget> targets;
  for (auto& p : reg.all()) targets.push_back({p->name, box_of(*p), &p->value});
  load_tensors(dir, targets);
}

}  // namespace moecore::ckpt
