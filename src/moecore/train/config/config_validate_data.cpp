// validate()'s data and logging checks (see config_validate.h): the data source, the tokenizer and what each type
// needs, the EOD mask, and the health alarms' flags. Not the files themselves (read at start: data/, model_builder).
#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"

namespace moecore::train {

void validate_data(const TrainConfig& c) {
  MOE_CHECK(c.mock_data != !c.data_path.empty(), "give exactly one of --data-path and --mock-data");
  if (c.tokenizer_type == "HuggingFaceTokenizer")
    MOE_CHECK(!c.tokenizer_model.empty(), "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model");
  if (c.tokenizer_type == "GPT2BPETokenizer")
    MOE_CHECK(!c.vocab_file.empty() && !c.merge_file.empty(),
              "--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
  if (c.tokenizer_type == "NullTokenizer" || c.tokenizer_type.empty())
    MOE_CHECK(c.vocab_size > 0, "--vocab-size is required with {} (or use --tokenizer-type HuggingFaceTokenizer)",
              c.tokenizer_type.empty() ? "no --tokenizer-type" : "NullTokenizer");
  MOE_CHECK(c.tokenizer_type != "" || c.mock_data, "--data-path needs a --tokenizer-type");
  MOE_CHECK(!c.eod_mask_loss || !c.tokenizer_type.empty(),
            "--eod-mask-loss needs a --tokenizer-type (the tokenizer names the end-of-document token)");
  // Health alarms (train/routing_health.h).
  MOE_CHECK(!c.check_for_spiky_loss || c.loss_spike_factor > 0,
            "--check-for-spiky-loss asks for the loss-spike check that --loss-spike-factor 0 turns off: drop one "
            "(moecore checks by default, with Megatron's factor 10 over the first 100 samples)");
}

}  // namespace moecore::train
