// `moecore preprocess` and `moecore train-tokenizer`: the data-preparation subcommands.
#include "moecore/cli/data_commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/core/progress.h"
#include "moecore/data/bpe_trainer.h"
#include "moecore/data/preprocess.h"
#include "moecore/data/tokenizer.h"

namespace moecore::cli {

void add_preprocess_command(CLI::App& app, PreprocessArgs& a) {
  a.cmd = app.add_subcommand("preprocess", "Tokenize JSONL into Megatron .bin/.idx (tools/preprocess_data.py)");
  a.cmd->add_option("--input", a.opt.input, "Path to input JSONL")->required()->check(CLI::ExistingFile);
  a.cmd->add_option("--json-keys", a.opt.json_keys, "Keys to extract from each JSON line")->capture_default_str();
  a.cmd->add_option("--output-prefix", a.opt.output_prefix, "Writes {prefix}_{key}_document.bin/.idx")->required();
  a.cmd->add_option("--tokenizer-type", a.opt.tokenizer_type, "Tokenizer type")
      ->check(CLI::IsMember({"HuggingFaceTokenizer", "GPT2BPETokenizer"}))
      ->required();
  a.cmd->add_option("--tokenizer-model", a.opt.tokenizer_model,
                    "HuggingFaceTokenizer: tokenizer.json, or a directory holding it");
  a.cmd->add_option("--vocab-file", a.opt.vocab_file, "GPT2BPETokenizer: vocab.json")->check(CLI::ExistingFile);
  a.cmd->add_option("--merge-file", a.opt.merge_file, "GPT2BPETokenizer: merges.txt")->check(CLI::ExistingFile);
  a.cmd->add_flag("--append-eod", a.opt.append_eod, "Append the EOS token to each non-empty document");
  a.cmd->add_option("--workers", a.opt.workers, "Tokenizer threads")->required()->check(CLI::Range(1, 1024));
  a.cmd->add_option("--log-interval", a.opt.log_interval, "Documents between progress lines (non-terminal)")
      ->check(CLI::PositiveNumber);
  a.cmd->add_option("--partitions", a.partitions, "Input partitions (only 1 is supported)")
      ->check(CLI::Range(1, 1))
      ->capture_default_str();
}

void run_preprocess(const PreprocessArgs& a) {
  Progress bar("preprocess", static_cast<int64_t>(std::filesystem::file_size(a.opt.input)), "MB/s", 1e6);
  const data::PreprocessStats st = data::preprocess(
      a.opt, [&](int64_t docs, int64_t bytes, int64_t) { bar.update(bytes, fmt::format("{} documents", docs)); });
  bar.finish(fmt::format("{} documents, {} tokens, {:.1f} MB in {:.1f} s ({:.2f} MB/s)", st.documents, st.tokens,
                         static_cast<double>(st.bytes) / 1e6, st.seconds,
                         static_cast<double>(st.bytes) / 1e6 / std::max(st.seconds, 1e-9)));
  for (const auto& k : a.opt.json_keys) fmt::print("wrote {}_{}_document.bin/.idx\n", a.opt.output_prefix, k);
}

void add_train_tokenizer_command(CLI::App& app, TrainTokenizerArgs& a) {
  a.cmd = app.add_subcommand("train-tokenizer",
                             "Train a byte-level BPE vocabulary on a text corpus; writes tokenizer.json");
  a.cmd->add_option("--input", a.input, "Text file, or JSONL with --json-keys")->required()->check(CLI::ExistingFile);
  a.cmd->add_option("--json-keys", a.json_keys, "Read these keys from JSONL lines instead of raw text");
  a.cmd->add_option("--vocab-size", a.vocab_size, "Tokens in the vocabulary, special tokens included")
      ->check(CLI::Range(int64_t{257}, int64_t{1} << 20))
      ->capture_default_str();
  a.cmd->add_option("--output", a.output, "Directory for tokenizer.json and tokenizer_config.json")->required();
}

void run_train_tokenizer(const TrainTokenizerArgs& a) {
  std::string corpus;
  if (a.json_keys.empty()) {
    corpus = read_file(a.input, "--input");
  } else {
    std::ifstream f(a.input, std::ios::binary);
    MOE_CHECK(f.good(), "cannot open --input {}", a.input);
    std::string line;
    int64_t n = 0;
    while (std::getline(f, line)) {
      n++;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        MOE_CHECK(false, "{}:{}: not a JSON object: {}", a.input, n, e.what());
      }
      for (const auto& k : a.json_keys) {
        MOE_CHECK(j.contains(k) && j[k].is_string(), "{}:{}: no string key \"{}\"", a.input, n, k);
        corpus += j[k].get<std::string>();
        corpus += '\n';
      }
    }
  }
  const std::string eos = "<|endoftext|>";
  const std::string tj = data::train_bpe_tokenizer_json(corpus, a.vocab_size, {eos});
  std::filesystem::create_directories(a.output);
  const auto path = std::filesystem::path(a.output) / "tokenizer.json";
  // Each file replaced atomically: a full disk leaves an earlier tokenizer in --output as it was.
  write_file_atomic(path.string(), tj);
  write_file_atomic((std::filesystem::path(a.output) / "tokenizer_config.json").string(),
                    nlohmann::json({{"eos_token", eos}, {"tokenizer_class", "PreTrainedTokenizerFast"}}).dump(2));
  const data::Tokenizer t = data::Tokenizer::from_file(path.string());
  const auto ids = t.encode(corpus);
  fmt::print("wrote {} ({} tokens; {:.2f} bytes per token on the training text)\n", path.string(), t.vocab_size(),
             static_cast<double>(corpus.size()) / static_cast<double>(std::max<size_t>(ids.size(), 1)));
}

void add_corpus_command(CLI::App& app, CorpusArgs& a) {
  a.cmd = app.add_subcommand("corpus", "Write the embedded default corpus (Debian's fortunes) as JSONL");
  auto* f = a.cmd->add_subcommand("fortunes",
                                  "One JSON line {\"text\": ...} per fortune from the files directly in --source-dir");
  a.cmd->require_subcommand(1);
  f->add_option("--output", a.output, "JSONL file to write")->required();
  f->add_option("--source-dir", a.source_dir, "Directory of fortune files")->capture_default_str();
}

void run_corpus(const CorpusArgs& a) {
  namespace fs = std::filesystem;
  MOE_CHECK(fs::is_directory(a.source_dir),
            "{} does not exist: install Debian's 'fortunes' package (scripts/install-deps.sh does)", a.source_dir);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(a.source_dir))
    if (e.is_regular_file() && e.path().extension().empty()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string out;
  int64_t n = 0, bytes = 0;
  for (const auto& p : files) {
    const std::string text = read_file(p.string(), "fortune file");
    if (data::find_invalid_utf8(text) >= 0) continue;  // not a text file of fortunes (none in the package)
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find("\n%\n", pos);
      const size_t stop = end == std::string::npos ? text.size() : end + 1;
      std::string fortune = text.substr(pos, stop - pos);
      pos = end == std::string::npos ? text.size() : end + 3;
      if (fortune.find_first_not_of(" \t\n") == std::string::npos) continue;
      out += nlohmann::json({{"text", fortune}}).dump() + '\n';
      n++;
      bytes += static_cast<int64_t>(fortune.size());
    }
  }
  MOE_CHECK(n > 0, "no fortunes found in {}", a.source_dir);
  write_file_atomic(a.output, out);
  fmt::print("wrote {}: {} fortunes from {} files, {:.2f} MB of text\n", a.output, n, files.size(),
             static_cast<double>(bytes) / 1e6);
}

}  // namespace moecore::cli
