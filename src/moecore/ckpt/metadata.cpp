// Checksummed, versioned, validated checkpoint metadata (see metadata.h).
#include "moecore/ckpt/metadata.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <cmath>
#include <filesystem>
#include <regex>

#include "moecore/core/error.h"
#include "moecore/core/file.h"

namespace moecore::ckpt {

namespace {
std::string checksum_hex(const nlohmann::json& j) {
  const std::string text = j.dump();  // compact, keys sorted: the same bytes after any parse and re-dump
  return fmt::format("{:016x}", XXH3_64bits(text.data(), text.size()));
}
}  // namespace

nlohmann::json with_checksum(nlohmann::json j) {
  MOE_ASSERT(j.is_object());
  j.erase("checksum");
  const std::string sum = checksum_hex(j);
  j["checksum"] = sum;
  return j;
}

std::string metadata_text(const nlohmann::json& j) {
  return with_checksum(j).dump(1) + "\n";
}

nlohmann::json read_metadata(const std::string& path, const char* what, const std::vector<std::string>& formats,
                             bool* legacy) {
  MOE_ASSERT(!formats.empty());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(moecore::read_file(path, what));
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "{} is not valid JSON ({}): {}", path, e.what(), kMetadataFix);
  }
  MOE_CHECK(j.is_object(), "{}: expected a JSON object, found {}; {}", path, j.type_name(), kMetadataFix);
  MOE_CHECK(j.contains("format") && j["format"].is_string(), "{}: field 'format' is missing or not a string; {}", path,
            kMetadataFix);
  const std::string format = j["format"].get<std::string>();
  size_t which = formats.size();
  for (size_t i = 0; i < formats.size(); i++)
    if (format == formats[i]) which = i;
  MOE_CHECK(which < formats.size(),
            "{}: field 'format' is '{}', expected '{}' (this moecore reads {}); a checkpoint written by a newer "
            "moecore needs that version",
            path, format, formats[0], fmt::join(formats, ", "));
  if (legacy) *legacy = which > 0;
  const bool has_sum = j.contains("checksum");
  MOE_CHECK(has_sum || which > 0, "{}: field 'checksum' is missing (format {} always has one); {}", path, format,
            kMetadataFix);
  if (!has_sum) return j;
  MOE_CHECK(j["checksum"].is_string(), "{}: field 'checksum' is not a string; {}", path, kMetadataFix);
  const std::string stored = j["checksum"].get<std::string>();
  j.erase("checksum");
  const std::string computed = checksum_hex(j);
  MOE_CHECK(stored == computed, "{}: checksum mismatch (stored {}, computed {}): {}", path, stored, computed,
            kMetadataFix);
  return j;
}

Fields::Fields(const nlohmann::json& j, std::string file, std::string prefix)
    : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!j_.is_object()) fail("", fmt::format("is a {}, expected an object", j_.type_name()));
}

void Fields::fail(const std::string& key, const std::string& problem) const {
  const std::string name = prefix_.empty() ? key : key.empty() ? prefix_ : prefix_ + "." + key;
  throw Error(fmt::format("{}: field '{}' {}; {}", file_, name, problem, kMetadataFix));
}

bool Fields::has(const char* key) const {
  return j_.contains(key);
}

const nlohmann::json& Fields::at(const char* key) const {
  if (!j_.contains(key)) fail(key, "is missing");
  return j_.at(key);
}

int64_t Fields::integer(const char* key, int64_t lo, int64_t hi) const {
  const auto& v = at(key);
  if (!v.is_number_integer()) fail(key, fmt::format("is {}, expected an integer", v.dump()));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(key, fmt::format("is {}, out of range", v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    fail(key, hi == INT64_MAX ? fmt::format("is {}, expected an integer >= {}", x, lo)
                              : fmt::format("is {}, expected an integer in [{}, {}]", x, lo, hi));
  return x;
}

bool Fields::boolean(const char* key) const {
  const auto& v = at(key);
  if (!v.is_boolean()) fail(key, fmt::format("is {}, expected true or false", v.dump()));
  return v.get<bool>();
}

double Fields::number_or_null(const char* key) const {
  const auto& v = at(key);
  if (v.is_null()) return std::nan("");
  if (!v.is_number()) fail(key, fmt::format("is {}, expected a number", v.dump()));
  return v.get<double>();
}

std::string Fields::string(const char* key) const {
  const auto& v = at(key);
  if (!v.is_string()) fail(key, fmt::format("is {}, expected a string", v.dump()));
  return v.get<std::string>();
}

Fields Fields::object(const char* key) const {
  const auto& v = at(key);
  if (!v.is_object()) fail(key, fmt::format("is a {}, expected an object", v.type_name()));
  return Fields(v, file_, prefix_.empty() ? key : prefix_ + "." + key);
}

void validate_train_state(const nlohmann::json& state, const std::string& dir) {
  const std::string file = dir + "/train_state.json";
  const Fields f(state, file);
  const bool release = f.has("release") && f.boolean("release");
  const int64_t iteration = f.integer("iteration", 0);
  const int64_t consumed = f.integer("consumed_samples", 0);
  f.boolean("optimizer");
  const Fields vocab = f.object("vocab");
  const int64_t vsize = vocab.integer("size", 1);
  vocab.integer("padded", vsize);
  const Fields config = f.object("config");
  if (release) {
    if (iteration != 0 || consumed != 0) f.fail("iteration", "must be 0 with consumed_samples 0 in a release");
    return;
  }
  // The iteration is the directory's, as the marker and --ckpt-step name it.
  static const std::regex iter_dir(R"(iter_(\d{7,}))");
  std::smatch m;
  const std::string name = std::filesystem::path(dir).filename().string();
  if (std::regex_match(name, m, iter_dir) && std::stoll(m[1].str()) != iteration)
    f.fail("iteration", fmt::format("is {}, but the directory is {}", iteration, name));
  if (consumed < iteration)
    f.fail("consumed_samples", fmt::format("is {}, less than one sample per iteration ({})", consumed, iteration));
  const Fields layout = f.object("layout");
  const int64_t world = layout.integer("world", 1);
  for (const char* k : {"tp", "dp", "ep", "etp"}) {
    const int64_t n = layout.integer(k, 1, world);
    if (world % n != 0) layout.fail(k, fmt::format("is {}, which does not divide world {}", n, world));
  }
  layout.boolean("distributed_optimizer");
  const Fields rng = f.object("rng");
  rng.integer("seed", INT64_MIN);
  const Fields counts = rng.object("router_forward_counts");
  for (auto it = counts.json().begin(); it != counts.json().end(); ++it) counts.integer(it.key().c_str(), 0);
  const Fields sums = f.object("log_interval_sums");
  for (const char* k : {"lm_loss", "grad_norm", "z_loss"}) sums.number_or_null(k);
  if (!sums.json().contains("aux") || !sums.json()["aux"].is_array()) sums.fail("aux", "is not a list of numbers");
  for (const auto& a : sums.json()["aux"])
    if (!a.is_number() && !a.is_null()) sums.fail("aux", fmt::format("holds {}, expected numbers", a.dump()));
  sums.integer("steps", 0, iteration);
  // consumed_samples follows from the iteration: every step of the run that saved this consumed one global batch
  // since the point it started from (format 2 records it; format 1 did not).
  if (f.has("run_start")) {
    const Fields start = f.object("run_start");
    const int64_t i0 = start.integer("iteration", 0, iteration);
    const int64_t s0 = start.integer("consumed_samples", 0, consumed);
    const int64_t gbs = config.integer("global-batch-size", 1);
    const int64_t want = s0 + (iteration - i0) * gbs;
    if (consumed != want)
      f.fail("consumed_samples",
             fmt::format("is {}, but the run saving it started at iteration {} with {} samples consumed and took {} "
                         "per iteration (--global-batch-size): {} expected at iteration {}",
                         consumed, i0, s0, gbs, want, iteration));
  }
}

void validate_state_against_index(const nlohmann::json& state, const std::vector<ShardRecord>& records,
                                  const std::string& dir) {
  const std::string file = dir + "/train_state.json";
  const Fields f(state, file);
  const int64_t padded = f.object("vocab").integer("padded", 1);
  bool moments = false;
  static const std::regex rank_file(R"(model_rank(\d+)\.safetensors)");
  const int64_t world = state.contains("layout") ? f.object("layout").integer("world", 1) : 1;
  for (const auto& r : records) {
    if (r.name == "embedding.word_embeddings.weight" && r.box.global[0] != padded)
      f.fail("vocab.padded",
             fmt::format("is {}, but index.json stores {} with {} rows", padded, r.name, r.box.global[0]));
    if (r.name.rfind("optimizer.exp_avg.", 0) == 0) moments = true;
    std::smatch m;
    if (std::regex_match(r.file, m, rank_file) && std::stoll(m[1].str()) >= world)
      f.fail("layout.world", fmt::format("is {}, but index.json names {}", world, r.file));
  }
  if (f.boolean("optimizer") && !moments)
    f.fail("optimizer", "is true, but index.json holds no optimizer.exp_avg.* tensors");
}

}  // namespace moecore::ckpt
