// Preprocess (see preprocess.h). Lines are read in blocks; workers tokenize a block's lines in parallel and the
// main thread appends the results in line order, so the output does not depend on the worker count.
#include "moecore/data/preprocess.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "moecore/core/error.h"
#include "moecore/core/timer.h"
#include "moecore/data/indexed_dataset.h"
#include "moecore/data/tokenizer.h"

namespace moecore::data {

std::string resolve_tokenizer_json(const std::string& model) {
  namespace fs = std::filesystem;
  MOE_CHECK(!model.empty(), "--tokenizer-model is required with --tokenizer-type HuggingFaceTokenizer");
  if (fs::is_directory(model)) {
    const fs::path p = fs::path(model) / "tokenizer.json";
    MOE_CHECK(fs::exists(p), "--tokenizer-model {} is a directory without tokenizer.json", model);
    return p.string();
  }
  MOE_CHECK(fs::exists(model), "--tokenizer-model {} does not exist", model);
  return model;
}

Tokenizer load_tokenizer(const std::string& type, const std::string& model, const std::string& vocab_file,
                         const std::string& merge_file) {
  if (type == "GPT2BPETokenizer") {
    MOE_CHECK(!vocab_file.empty() && !merge_file.empty(),
              "--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
    return Tokenizer::from_gpt2_files(vocab_file, merge_file);
  }
  MOE_CHECK(type == "HuggingFaceTokenizer", "--tokenizer-type {}: use HuggingFaceTokenizer or GPT2BPETokenizer", type);
  return Tokenizer::from_file(resolve_tokenizer_json(model));
}

namespace {

struct Encoded {
  std::vector<std::vector<int32_t>> ids;   // per key
  std::vector<std::vector<int32_t>> lens;  // per key: sentence lengths
};

// Megatron's Encoder.encode for one JSONL line: a string, or a list of strings (sentences); empty sentences
// contribute nothing; EOS goes after the last non-empty sentence.
Encoded encode_line(const std::string& line, int64_t line_no, const PreprocessOptions& opt, const Tokenizer& tok,
                    int32_t eod) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "{}:{}: not a JSON object: {}", opt.input, line_no, e.what());
  }
  MOE_CHECK(j.is_object(), "{}:{}: expected a JSON object, got {}", opt.input, line_no, j.type_name());
  Encoded out;
  for (const auto& key : opt.json_keys) {
    MOE_CHECK(j.contains(key), "{}:{}: no key \"{}\" (set --json-keys to the field holding the text)", opt.input,
              line_no, key);
    const auto& v = j[key];
    std::vector<std::string> sentences;
    if (v.is_string()) {
      sentences.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const auto& s : v) {
        MOE_CHECK(s.is_string(), "{}:{}: \"{}\" is a list containing a {}, expected strings", opt.input, line_no, key,
                  s.type_name());
        sentences.push_back(s.get<std::string>());
      }
    } else {
      MOE_CHECK(false, "{}:{}: \"{}\" is a {}, expected a string or a list of strings", opt.input, line_no, key,
                v.type_name());
    }
    std::vector<int32_t> ids, lens;
    for (const auto& s : sentences) {
      std::vector<int32_t> sid;
      try {
        sid = tok.encode(s);
      } catch (const Error& e) {
        MOE_CHECK(false, "{}:{}: \"{}\": {}", opt.input, line_no, key, e.what());
      }
      if (!sid.empty()) {
        ids.insert(ids.end(), sid.begin(), sid.end());
        lens.push_back(static_cast<int32_t>(sid.size()));
      }
    }
    if (!ids.empty() && opt.append_eod) {
      ids.push_back(eod);
      lens.back() += 1;
    }
    out.ids.push_back(std::move(ids));
    out.lens.push_back(std::move(lens));
  }
  return out;
}

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& opt,
                           const std::function<void(int64_t, int64_t, int64_t)>& progress) {
  MOE_CHECK(!opt.input.empty(), "--input is required");
  MOE_CHECK(!opt.output_prefix.empty(), "--output-prefix is required");
  MOE_CHECK(!opt.json_keys.empty(), "--json-keys needs at least one key");
  MOE_CHECK(opt.workers >= 1, "--workers must be >= 1, got {}", opt.workers);
  std::ifstream in(opt.input, std::ios::binary);
  MOE_CHECK(in.good(), "cannot open --input {}", opt.input);
  const int64_t total_bytes = static_cast<int64_t>(std::filesystem::file_size(opt.input));
  const Tokenizer tok = load_tokenizer(opt.tokenizer_type, opt.tokenizer_model, opt.vocab_file, opt.merge_file);
  int32_t eod = -1;
  if (opt.append_eod) {
    MOE_CHECK(tok.eos_id().has_value(),
              "--append-eod needs the tokenizer's EOS token, but {} has no tokenizer_config.json with eos_token "
              "next to it",
              tok.source());  // GPT2BPETokenizer always has one (<|endoftext|>)
    eod = *tok.eos_id();
  }
  const IndexDType dtype = optimal_index_dtype(tok.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& key : opt.json_keys)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(opt.output_prefix + "_" + key + "_document.bin", dtype));
  PreprocessStats st;
  const Stopwatch timer;
  const size_t kBlock = 4096;  // lines per block
  std::vector<std::string> lines;
  std::vector<Encoded> enc;
  int64_t line_no = 0;
  bool eof = false;
  while (!eof) {
    lines.clear();
    std::string line;
    while (lines.size() < kBlock && std::getline(in, line)) {
      st.bytes += static_cast<int64_t>(line.size()) + 1;
      lines.push_back(std::move(line));
    }
    eof = lines.size() < kBlock;
    enc.assign(lines.size(), Encoded{});
    // Each worker stops at its first bad line; the earliest bad line is reported.
    std::vector<std::pair<int64_t, std::string>> errors(static_cast<size_t>(opt.workers), {INT64_MAX, ""});
    auto work = [&](int w) {
      size_t i = static_cast<size_t>(w);
      try {
        for (; i < lines.size(); i += static_cast<size_t>(opt.workers))
          enc[i] = encode_line(lines[i], line_no + static_cast<int64_t>(i) + 1, opt, tok, eod);
      } catch (const Error& e) {
        errors[static_cast<size_t>(w)] = {static_cast<int64_t>(i), e.what()};
      }
    };
    if (opt.workers == 1) {
      work(0);
    } else {
      std::vector<std::thread> th;
      for (int w = 0; w < opt.workers; w++) th.emplace_back(work, w);
      for (auto& t : th) t.join();
    }
    const auto first = *std::min_element(errors.begin(), errors.end());
    MOE_CHECK(first.second.empty(), "{}", first.second);
    for (auto& e : enc) {
      for (size_t k = 0; k < builders.size(); k++) {
        builders[k]->add_document(e.ids[k], e.lens[k]);
        st.tokens += static_cast<int64_t>(e.ids[k].size());
      }
      st.documents++;
    }
    line_no += static_cast<int64_t>(lines.size());
    if (progress) progress(st.documents, st.bytes, total_bytes);
  }
  for (size_t k = 0; k < builders.size(); k++)
    builders[k]->finalize(opt.output_prefix + "_" + opt.json_keys[k] + "_document.idx");
  st.seconds = timer.seconds();
  return st;
}

}  // namespace moecore::data
