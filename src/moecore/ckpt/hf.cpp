// HuggingFace interop (see hf.h).
#include "moecore/ckpt/hf.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "moecore/ckpt/hf_util.h"
#include "moecore/ckpt/manager.h"
#include "moecore/ckpt/metadata.h"
#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/core/progress.h"
#include "moecore/moe/moe_layer.h"

namespace moecore::ckpt {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(moecore::read_file(path, "JSON file"));
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "{} is not valid JSON ({})", path, e.what());
  }
  return {};
}

// Boxes of `global` along its first dimension (experts, vocabulary rows) holding at most about `bytes` of f32 each
// (at least one index).
std::vector<Box> row_chunks(const Shape& global, int64_t bytes) {
  const int64_t rows = global[0], row_bytes = global.numel() / std::max<int64_t>(rows, 1) * 4;
  const int64_t per_chunk = std::clamp<int64_t>(bytes / std::max<int64_t>(row_bytes, 1), 1, std::max<int64_t>(rows, 1));
  std::vector<Box> out;
  for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
    Box b = whole_box(global);
    b.offset[0] = r0;
    b.size.set(0, std::min(per_chunk, rows - r0));
    out.push_back(b);
  }
  return out;
}

}  // namespace

HFModel::HFModel(const std::string& dir) : dir_(dir) {
  const std::string cpath = dir + "/config.json";
  MOE_CHECK(fs::exists(cpath), "{} has no config.json: not a HuggingFace model directory", dir);
  config_ = read_json(cpath);
  arch_ = hf_architecture(config_, cpath);
  const std::string ipath = dir + "/model.safetensors.index.json";
  if (fs::exists(ipath)) {
    const nlohmann::json idx = read_json(ipath);
    MOE_CHECK(idx.contains("weight_map") && idx["weight_map"].is_object(), "{} has no weight_map", ipath);
    for (const auto& [name, file] : idx["weight_map"].items()) {
      MOE_CHECK(file.is_string() && file.get<std::string>().find('/') == std::string::npos,
                "{}: '{}' maps to an invalid file {}", ipath, name, file.dump());
      file_of_[name] = file.get<std::string>();
    }
  } else {
    MOE_CHECK(fs::exists(dir + "/model.safetensors"),
              "{} has neither model.safetensors.index.json nor model.safetensors", dir);
    auto f = std::make_unique<SafetensorsFile>(dir + "/model.safetensors");
    for (const auto& [name, e] : f->entries()) file_of_[name] = "model.safetensors";
    files_["model.safetensors"] = std::move(f);
  }
  // FP8 checkpoints (DeepSeek-V3's): e4m3 weights with a weight_scale_inv per block, dequantized on read.
  if (config_.contains("quantization_config") && !config_["quantization_config"].is_null()) {
    const nlohmann::json& q = config_["quantization_config"];
    const std::string where = cpath + " quantization_config";
    MOE_CHECK(q.is_object() && hf::get<std::string>(q, "quant_method", "", where) == "fp8" &&
                  hf::get<std::string>(q, "fmt", "e4m3", where) == "e4m3",
              "{}: {} is not supported (moecore dequantizes fp8 e4m3 with block scales)", where, q.dump());
    const auto block = hf::get<std::vector<int64_t>>(q, "weight_block_size", {128, 128}, where);
    MOE_CHECK(block.size() == 2 && block[0] > 0 && block[1] > 0, "{}: weight_block_size must be [rows, columns]",
              where);
    fp8_block_[0] = block[0], fp8_block_[1] = block[1];
  }
  // Every tensor must be one the map places: anything else (biases, another architecture's extras) would be
  // silently dropped.
  std::set<std::string> known;
  for (const auto& t : native_tensors(arch_))
    for (const auto& p : t.pieces) {
      known.insert(p.hf_name);
      known.insert(p.hf_name + "_scale_inv");  // read with its FP8 weight
    }
  std::string unknown;
  int n = 0;
  for (const auto& [name, file] : file_of_) {
    const bool ignorable =
        name.find("rotary_emb.inv_freq") != std::string::npos || (arch_.tied && name == "lm_head.weight");
    if (known.count(name) || ignorable) continue;
    if (n++ < 8) unknown += "\n  " + name + " (" + file + ")";
  }
  MOE_CHECK(n == 0, "{} holds {} tensor(s) the {} mapping does not know, which would be dropped:{}{}", dir, n,
            arch_.kind, unknown, n > 8 ? "\n  ..." : "");
}

Tensor HFModel::read_piece(const HFPiece& p) {
  auto open = [&](const std::string& name) -> SafetensorsFile& {
    const auto it = file_of_.find(name);
    MOE_CHECK(it != file_of_.end(), "{}: tensor {} is missing", dir_, name);
    auto& f = files_[it->second];
    if (!f) f = std::make_unique<SafetensorsFile>(dir_ + "/" + it->second);
    MOE_CHECK(f->contains(name), "{}: the index places {} in {}, which does not hold it", dir_, name, it->second);
    return *f;
  };
  SafetensorsFile& f = open(p.hf_name);
  Tensor x = f.read(p.hf_name);
  MOE_CHECK(x.shape() == p.hf_shape, "{}: {} in {} has shape {}, expected {} for this config.json", dir_, p.hf_name,
            f.path(), x.shape().str(), p.hf_shape.str());
  MOE_CHECK(x.dtype() == DType::BF16 || x.dtype() == DType::F32, "{}: {} is {}; bf16, f32 and fp8 e4m3 are supported",
            dir_, p.hf_name, dtype_name(x.dtype()));
  const DType stored = x.dtype();
  if (x.dtype() != DType::F32) x = x.to(DType::F32);
  const std::string sname = p.hf_name + "_scale_inv";
  if (!f.entries().at(p.hf_name).f8_e4m3) {  // a scale beside an unquantized weight would be ignored: refused
    MOE_CHECK(!file_of_.count(sname),
              "{}: {} has a {} but is not FP8 ({}); moecore applies block scales to F8_E4M3 "
              "weights only",
              dir_, p.hf_name, sname, dtype_name(stored));
    return x;
  }
  // DeepSeek's weight_dequant: w[i, j] = fp8[i, j] · scale_inv[i / 128, j / 128].
  MOE_CHECK(x.ndim() == 2 && file_of_.count(sname), "{}: {} is FP8 but {} has no {} to dequantize it with", dir_,
            p.hf_name, dir_, sname);
  SafetensorsFile& sf = open(sname);
  Tensor s = sf.read(sname);
  const int64_t M = x.dim(0), N = x.dim(1), bm = fp8_block_[0], bn = fp8_block_[1];
  const Shape want{(M + bm - 1) / bm, (N + bn - 1) / bn};
  MOE_CHECK(s.dtype() == DType::F32 && s.shape() == want, "{}: {} in {} is {} {}, expected F32 {} for {} blocks of {}",
            dir_, sname, sf.path(), dtype_name(s.dtype()), s.shape().str(), want.str(), bm, bn);
  float* w = x.data<float>();
  const float* sc = s.data<float>();
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) w[i * N + j] *= sc[(i / bm) * want[1] + j / bn];
  return x;
}

void HFModel::read_into(const NativeTensor& t, Tensor& dst, const Box& db) {
  Tensor first;  // the first piece, kept while duplicates of it are checked
  for (const auto& p : t.pieces) {
    if (!boxes_intersect(p.box, db)) continue;
    const Tensor x = read_piece(p);
    if (p.duplicate) {  // must equal the first piece
      if (!first.defined()) first = read_piece(t.pieces.front());
      MOE_CHECK(std::memcmp(x.raw(), first.raw(), x.nbytes()) == 0,
                "{}: {} differs from {}; DeepSeek's MTP layer stores copies of the shared embedding and output "
                "head, which must be equal",
                dir_, p.hf_name, t.pieces.front().hf_name);
      continue;
    }
    if (&p == &t.pieces.front()) first = x;
    copy_intersection(x, p.box, dst, db);
  }
}

int64_t convert_hf_to_native(const std::string& hf_dir, const std::string& out_root, int64_t shard_bytes) {
  HFModel m(hf_dir);
  const std::vector<NativeTensor> tensors = native_tensors(m.architecture());
  int64_t bytes = 0, done = 0;  // as fp32
  for (const auto& t : tensors) bytes += t.global.numel() * 4;
  Progress bar("HF import", bytes, "MB/s", 1e6);  // shown only when reading takes a while
  const PendingSave save = begin_save(out_root, -1, nullptr);
  int64_t fragments = 0;
  try {
    std::vector<StoredTensor> shard;
    int64_t held = 0;
    auto flush = [&] {
      if (shard.empty()) return;
      write_rank_files(save, fragments++, shard, {});
      shard.clear();
      held = 0;
    };
    for (const auto& t : tensors) {
      // The native tensor in chunks along its first dimension (experts, vocabulary rows), each at most about
      // shard_bytes, each assembled from the HF pieces that intersect it (duplicates checked) and stored as a box of
      // its own. A shard file holds one box per name.
      for (const Box& b : row_chunks(t.global, shard_bytes)) {
        Tensor chunk = Tensor::zeros(b.size, DType::F32);
        m.read_into(t, chunk, b);
        if (!shard.empty() && shard.back().name == t.name) flush();  // a tensor's chunks are consecutive
        held += static_cast<int64_t>(chunk.nbytes());
        shard.push_back({t.name, b, chunk});
        if (held >= shard_bytes) flush();
      }
      done += t.global.numel() * 4;
      bar.update(done, fmt::format("{} of {} tensors", &t - tensors.data() + 1, tensors.size()));
    }
    flush();
  } catch (const Error&) {
    abandon_save(save, 0);
    throw;
  }
  bar.finish_if_shown(fmt::format("read {} tensors ({:.1f} MB as fp32) from {}", tensors.size(),
                                  static_cast<double>(bytes) / 1e6, hf_dir));
  nlohmann::json state = {{"format", kTrainStateFormat},
                          {"release", true},
                          {"iteration", 0},
                          {"consumed_samples", 0},
                          {"optimizer", false},
                          {"vocab", {{"size", m.architecture().vocab}, {"padded", m.architecture().vocab}}},
                          {"layout", {{"world", fragments}}},  // the shard files, as if written by that many ranks
                          {"hf", {{"architecture", m.architecture().kind}, {"source", fs::absolute(hf_dir).string()}}},
                          {"config", hf_train_flags(m.config(), hf_dir + "/config.json")}};
  // The original config.json travels verbatim (native-to-hf writes it back); the tokenizer too.
  std::vector<std::pair<std::string, std::string>> extra{
      {"hf_config.json", moecore::read_file(hf_dir + "/config.json", "HF config")}};
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(hf_dir + "/" + f)) extra.push_back({f, moecore::read_file(hf_dir + "/" + f, "HF tokenizer file")});
  commit_save(save, state, nullptr, extra, fragments);
  return static_cast<int64_t>(tensors.size());
}

int64_t convert_native_to_hf(const std::string& native, const std::string& out_dir, const std::string& kind_flag,
                             std::string dtype, int64_t max_shard_bytes) {
  const auto found = find_checkpoint(native);
  MOE_CHECK(found, "--input {} holds no moecore checkpoint", native);
  const nlohmann::json& st = found->state;
  MOE_CHECK(st.contains("config") && st.contains("vocab"), "{}/{} lacks config or vocab", found->dir, kStateFile);
  const int64_t vocab = st["vocab"].value("padded", int64_t{0});
  const std::string hfc = found->dir + "/hf_config.json";
  std::string config_text, kind = kind_flag;
  if (fs::exists(hfc)) {  // converted from HF: its config.json, exactly
    config_text = moecore::read_file(hfc, "HF config");
    const nlohmann::json c = nlohmann::json::parse(config_text);
    const std::string k = hf::kind_of(c, hfc);
    MOE_CHECK(kind.empty() || kind == k, "--arch {}: the checkpoint came from a {} model", kind, k);
    kind = k;
    if (dtype.empty()) dtype = c.value("torch_dtype", "bfloat16") == "float32" ? "f32" : "bf16";
    if (c.contains("quantization_config")) {  // an FP8 original: the export holds the dequantized weights
      nlohmann::ordered_json o = nlohmann::ordered_json::parse(config_text);
      o.erase("quantization_config");
      o["torch_dtype"] = dtype == "f32" ? "float32" : "bfloat16";
      config_text = o.dump(2) + "\n";
    }
  }
  if (dtype.empty()) dtype = "bf16";
  MOE_CHECK(dtype == "bf16" || dtype == "f32", "--dtype {}: use bf16 or f32", dtype);
  const HFArchitecture a = architecture_from_flags(st["config"], vocab, kind);
  if (config_text.empty()) config_text = hf_config_from_flags(st["config"], a, dtype).dump(2) + "\n";
  fs::create_directories(out_dir);
  const DType dt = dtype == "f32" ? DType::F32 : DType::BF16;
  std::vector<NamedTensor> shard;
  int64_t shard_bytes = 0, total = 0, count = 0;
  std::vector<std::vector<std::string>> shard_names;
  auto flush = [&] {
    if (shard.empty()) return;
    write_safetensors(fmt::format("{}/part-{:05d}.tmp", out_dir, shard_names.size()), shard, {{"format", "pt"}});
    std::vector<std::string> names;
    for (const auto& t : shard) names.push_back(t.name);
    shard_names.push_back(names);
    shard.clear();
    shard_bytes = 0;
  };
  const std::vector<ShardRecord> records = read_model_index(found->dir);
  const std::vector<NativeTensor> tensors = native_tensors(a);
  int64_t bytes = 0, done = 0;  // as fp32
  for (const auto& t : tensors) bytes += t.global.numel() * 4;
  Progress bar("HF export", bytes, "MB/s", 1e6);  // shown only when the export takes a while
  for (const auto& t : tensors) {
    bar.update(done, fmt::format("{} of {} tensors", &t - tensors.data(), tensors.size()));
    done += t.global.numel() * 4;
    auto emit = [&](const HFPiece& p, Tensor x) {
      x = x.reshape(p.hf_shape);
      if (dt != DType::F32 && !p.keep_f32) x = x.to(dt);
      if (shard_bytes > 0 && shard_bytes + static_cast<int64_t>(x.nbytes()) > max_shard_bytes) flush();
      shard_bytes += static_cast<int64_t>(x.nbytes());
      total += static_cast<int64_t>(x.nbytes());
      shard.push_back({p.hf_name, x});
      count++;
    };
    // The native tensor in chunks of about 1 GiB along its first dimension (experts, vocabulary rows), each loaded
    // once and cut into the HF tensors inside it; an HF tensor wider than a chunk is loaded alone.
    std::vector<bool> placed(t.pieces.size(), false);
    for (const Box& b : row_chunks(t.global, int64_t{1} << 30)) {
      Tensor chunk;
      for (size_t i = 0; i < t.pieces.size(); i++) {
        const HFPiece& p = t.pieces[i];
        if (p.box.offset[0] < b.offset[0] || p.box.offset[0] + p.box.size[0] > b.offset[0] + b.size[0]) continue;
        if (!chunk.defined()) {
          chunk = Tensor::empty(b.size, DType::F32);
          load_tensors(found->dir, records, {LoadTarget{t.name, b, &chunk}});
        }
        Tensor x = Tensor::empty(p.box.size, DType::F32);
        copy_intersection(chunk, b, x, p.box);
        emit(p, x);
        placed[i] = true;
      }
    }
    for (size_t i = 0; i < t.pieces.size(); i++)
      if (!placed[i]) {
        const HFPiece& p = t.pieces[i];
        Tensor x = Tensor::empty(p.box.size, DType::F32);
        load_tensors(found->dir, records, {LoadTarget{t.name, p.box, &x}});
        emit(p, x);
      }
  }
  flush();
  bar.finish_if_shown(
      fmt::format("wrote {} tensors ({:.1f} MB) to {}", count, static_cast<double>(total) / 1e6, out_dir));
  nlohmann::json map = nlohmann::json::object();
  const size_t n = shard_names.size();
  for (size_t i = 0; i < n; i++) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    rename_checked(fmt::format("{}/part-{:05d}.tmp", out_dir, i), out_dir + "/" + name);
    for (const auto& t : shard_names[i]) map[t] = name;
  }
  // Files an earlier export may hold are replaced atomically: a failure leaves them as they were.
  write_file_atomic(out_dir + "/model.safetensors.index.json",
                    nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n");
  write_file_atomic(out_dir + "/config.json", config_text);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(found->dir + "/" + f))
      write_file_atomic(out_dir + "/" + f, moecore::read_file(found->dir + "/" + f, "tokenizer file"));
  return count;
}

}  // namespace moecore::ckpt
