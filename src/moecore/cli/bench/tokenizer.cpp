// `moecore bench tokenizer`: tokenizer encode MB/s on one thread (steady state and cold cache) and on several
// worker threads, over documents of a text file, and on one long run of letters the pre-tokenizer cannot split
// (BPE's worst case: its cost must stay O(n log n) in the word). Not preprocessing (no dataset files are written).
#include "moecore/data/tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <thread>

#include "moecore/cli/bench/benches.h"
#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/core/timer.h"

namespace moecore::cli {

namespace {
struct TokenizerBenchArgs {
  std::string tokenizer_json, input;
  int workers = 2;
  int64_t no_split_bytes = 1000000;
};

// The text: a file, or by default the English fortunes shipped by Debian.
std::string bench_text(const std::string& input) {
  if (!input.empty()) return read_file(input, "--input");
  std::string text;
  for (const char* f : {"fortunes", "literature", "riddles", "science", "wisdom", "people", "computers", "humorists"}) {
    const std::string p = std::string("/usr/share/games/fortunes/") + f;
    if (std::filesystem::exists(p)) text += read_file(p, "text file");
  }
  MOE_CHECK(!text.empty(), "no default text: the Debian package 'fortunes' is not installed; pass --input FILE");
  return text;
}

// `bytes` bytes of the text's ASCII letters with everything else dropped: one pre-tokenizer word (\p{L}+) of
// English-like letter statistics, so the merges fire as they would inside real words.
std::string no_split_text(const std::string& text, int64_t bytes) {
  std::string letters;
  for (char c : text)
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) letters += c;
  MOE_CHECK(!letters.empty(), "the bench text has no ASCII letters to build the no-split word from");
  std::string word;
  word.reserve(static_cast<size_t>(bytes));
  while (static_cast<int64_t>(word.size()) < bytes) word += letters;
  word.resize(static_cast<size_t>(bytes));
  return word;
}

// Documents: paragraphs separated by the fortune delimiter or blank lines, as a JSONL corpus would give them.
std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n%\n", pos);
    end = end == std::string::npos ? text.size() : end + 3;
    docs.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return docs;
}

void run_bench_tokenizer(const TokenizerBenchArgs& a) {
  const std::string& tokenizer_json = a.tokenizer_json;
  const int workers = a.workers;
  MOE_CHECK(workers >= 1, "--workers must be >= 1, got {}", workers);
  const std::string text = bench_text(a.input);
  const std::vector<std::string> docs = split_documents(text);
  const double mb = static_cast<double>(text.size()) / 1e6;
  const Stopwatch load;
  const data::Tokenizer tok = data::Tokenizer::from_file(tokenizer_json);
  fmt::print("moecore bench tokenizer: {} ({} tokens), {:.2f} MB of text in {} documents; load {:.2f} s\n",
             tokenizer_json, tok.vocab_size(), mb, docs.size(), load.seconds());
  // One thread runs on the calling thread, so its second pass sees the piece cache a long preprocessing run
  // would have (steady state); worker runs start fresh threads with cold caches (a conservative figure).
  auto run = [&](int nthreads) {
    std::vector<std::thread> threads;
    std::vector<int64_t> counts(static_cast<size_t>(nthreads), 0);
    auto work = [&](int w) {
      for (size_t i = static_cast<size_t>(w); i < docs.size(); i += static_cast<size_t>(nthreads))
        counts[static_cast<size_t>(w)] += static_cast<int64_t>(tok.encode(docs[i]).size());
    };
    const Stopwatch timer;
    if (nthreads == 1) {
      work(0);
    } else {
      for (int w = 0; w < nthreads; w++) threads.emplace_back(work, w);
    }
    for (auto& th : threads) th.join();
    const double dt = timer.seconds();
    int64_t tokens = 0;
    for (int64_t c : counts) tokens += c;
    return std::make_pair(mb / dt, tokens);
  };
  const auto [cold, tokens] = run(1);
  const auto [one, tokens2] = run(1);
  MOE_ASSERT(tokens2 == tokens);
  fmt::print("  1 thread:  {:7.2f} MB/s steady state, {:.2f} MB/s from a cold cache ({} tokens, {:.2f} bytes/token)\n",
             one, cold, tokens, static_cast<double>(text.size()) / static_cast<double>(tokens));
  if (workers > 1) {
    const auto [many, t2] = run(workers);
    MOE_ASSERT(t2 == tokens);
    fmt::print("  {} workers: {:7.2f} MB/s from cold caches ({:.2f} MB/s per worker)\n", workers, many, many / workers);
  }
  if (a.no_split_bytes > 0) {
    // Not in the word cache (never seen), so this is the BPE merge loop on one word of the full length.
    const std::string word = no_split_text(text, a.no_split_bytes);
    const Stopwatch timer;
    const size_t n = tok.encode(word).size();
    const double seconds = timer.seconds();
    const double rate = static_cast<double>(word.size()) / 1e6 / seconds;
    fmt::print("  no-split word: bytes={} tokens={} seconds={:.3f} mb_s={:.4g} normal_cold_mb_s={:.2f} ratio={:.3g}\n",
               word.size(), n, seconds, rate, cold, rate / cold);
  }
}
}  // namespace

BenchCommand add_tokenizer_bench(CLI::App& bench) {
  auto a = std::make_shared<TokenizerBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("tokenizer", "Tokenizer encode MB/s on one thread and on several workers");
  cmd->add_option("--tokenizer-model", a->tokenizer_json, "Path to tokenizer.json")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--input", a->input, "Text file (default: Debian's English fortunes)")->check(CLI::ExistingFile);
  cmd->add_option("--workers", a->workers, "Worker threads")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--no-split-bytes", a->no_split_bytes,
                  "Also time one word of this many letters without a pre-tokenizer split (0: skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  return {cmd, [a] { run_bench_tokenizer(*a); }};
}

}  // namespace moecore::cli
