// Data-preparation subcommands of the moecore program.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "moecore/data/preprocess.h"

namespace moecore::cli {

struct PreprocessArgs {
  CLI::App* cmd = nullptr;
  data::PreprocessOptions opt;
  int partitions = 1;
};
void add_preprocess_command(CLI::App& app, PreprocessArgs& a);
void run_preprocess(const PreprocessArgs& a);

struct TrainTokenizerArgs {
  CLI::App* cmd = nullptr;
  std::string input, output;
  std::vector<std::string> json_keys;
  int64_t vocab_size = 4096;
};
void add_train_tokenizer_command(CLI::App& app, TrainTokenizerArgs& a);
void run_train_tokenizer(const TrainTokenizerArgs& a);

struct CorpusArgs {
  CLI::App* cmd = nullptr;
  std::string output;
  std::string source_dir = "/usr/share/games/fortunes";
};
void add_corpus_command(CLI::App& app, CorpusArgs& a);
void run_corpus(const CorpusArgs& a);

}  // namespace moecore::cli
