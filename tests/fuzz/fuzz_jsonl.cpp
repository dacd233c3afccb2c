// libFuzzer target: `moecore preprocess` input: JSONL lines, their keys and text (valid UTF-8 or not), tokenized
// with a small trained tokenizer and written to .bin/.idx. Input: the JSONL file's bytes. A moecore::Error is the
// expected answer to garbage; anything else is a bug.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "moecore/core/error.h"
#include "moecore/data/bpe_trainer.h"
#include "moecore/data/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& dir = moecore::fuzz::scratch_dir("fuzz_jsonl");
  static const bool tokenizer_written = [&] {
    const std::string corpus = "the cat sat on the mat\nthe dog sat on the log\n{\"text\": \"x\"}\n";
    const std::string j = moecore::data::train_bpe_tokenizer_json(corpus, 300, {"<|endoftext|>"});
    moecore::fuzz::write(dir / "tokenizer.json", j.data(), j.size());
    const std::string cfg = R"({"eos_token": "<|endoftext|>"})";
    moecore::fuzz::write(dir / "tokenizer_config.json", cfg.data(), cfg.size());
    return true;
  }();
  (void)tokenizer_written;
  moecore::fuzz::write(dir / "in.jsonl", reinterpret_cast<const char*>(data), size);
  moecore::data::PreprocessOptions opt;
  opt.input = (dir / "in.jsonl").string();
  opt.json_keys = {"text", "title"};
  opt.output_prefix = (dir / "out").string();
  opt.tokenizer_model = dir.string();
  opt.append_eod = true;
  try {
    (void)moecore::data::preprocess(opt);
  } catch (const moecore::Error&) {
  }
  return 0;
}
