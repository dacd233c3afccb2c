// GPT training samples the way Megatron-Core's GPTDataset builds them: the documents of a split, shuffled per
// epoch (as many epochs as the requested samples need), concatenated, cut into samples of seq_length + 1 tokens
// that span document boundaries (consecutive samples share one token, for the label shift), and the samples
// shuffled. Every index comes from the seed through Philox, so the order is the same on every rank and run;
// BlendedDataset mixes datasets by weight with Megatron's greedy error rule; MockGPTDataset gives synthetic
// tokens. A SampleCursor (consumed samples) is all a checkpoint needs to resume the order exactly.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/data/indexed_dataset.h"

namespace moecore::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // Sample i: seq_length + 1 tokens into out.
  virtual void get(int64_t i, int64_t* out) const = 0;
  virtual int64_t seq_length() const = 0;
};

class GPTDataset : public SampleSource {
 public:
  // Documents [doc_begin, doc_end) of `ds`; at least `num_samples` samples (more when the last epoch has room).
  GPTDataset(std::shared_ptr<const IndexedDataset> ds, int64_t doc_begin, int64_t doc_end, int64_t num_samples,
             int64_t seq_length, uint64_t seed, const std::string& name);
  int64_t size() const override { return static_cast<int64_t>(shuffle_.size()); }
  void get(int64_t i, int64_t* out) const override;
  int64_t seq_length() const override { return seq_length_; }
  int64_t num_epochs() const { return num_epochs_; }

 private:
  std::shared_ptr<const IndexedDataset> ds_;
  int64_t seq_length_;
  int64_t num_epochs_ = 0;
  std::vector<int64_t> doc_index_;                   // documents in stream order (all epochs)
  std::vector<std::pair<int64_t, int64_t>> sample_;  // (position in doc_index_, token offset) of each sample start
  std::vector<int64_t> shuffle_;
  std::vector<int64_t> doc_tokens_;  // tokens per document of ds
  void read_document(int64_t doc, int64_t offset, int64_t length, int64_t* out) const;
};

class BlendedDataset : public SampleSource {
 public:
  BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> parts, std::vector<double> weights, int64_t size);
  int64_t size() const override { return static_cast<int64_t>(which_.size()); }
  void get(int64_t i, int64_t* out) const override;
  int64_t seq_length() const override { return parts_[0]->seq_length(); }
  // Samples each part must provide for `size` blended samples (Megatron's 0.5% margin included).
  static std::vector<int64_t> part_sizes(const std::vector<double>& weights, int64_t size);

 private:
  std::vector<std::shared_ptr<const SampleSource>> parts_;
  std::vector<int32_t> which_;
  std::vector<int64_t> index_;
};

class MockGPTDataset : public SampleSource {
 public:
  MockGPTDataset(int64_t size, int64_t seq_length, int64_t vocab_size, uint64_t seed);
  int64_t size() const override { return size_; }
  void get(int64_t i, int64_t* out) const override;
  int64_t seq_length() const override { return seq_length_; }

 private:
  int64_t size_, seq_length_, vocab_;
  uint64_t seed_;
};

// "969,30,1" (or with '/') -> normalized [train, valid, test] fractions.
std::array<double, 3> parse_split(const std::string& split);
// Megatron's split of `n` documents by fractions: boundaries [0, a, b, n].
std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& fractions, int64_t n);
// --data-path words: "prefix" or "w1 prefix1 w2 prefix2 ..." -> (weights normalized, prefixes).
std::pair<std::vector<double>, std::vector<std::string>> parse_data_path(const std::vector<std::string>& words);

// Train/valid/test sources (null where a split gets no documents or no samples are requested).
std::array<std::shared_ptr<const SampleSource>, 3> build_gpt_datasets(const std::vector<std::string>& data_path,
                                                                      const std::string& split, int64_t seq_length,
                                                                      const std::array<int64_t, 3>& num_samples,
                                                                      uint64_t seed);

// Megatron's pretraining sampler: a global batch is consumed in micro-batches of mbs·dp samples, data-parallel
// rank r taking [r·mbs, (r+1)·mbs) of each. The state is the number of samples consumed so far.
struct SampleCursor {
  int64_t consumed_samples = 0;
  // Sample indices of micro-batch m (0-based within the current global batch) for one data-parallel rank.
  std::vector<int64_t> micro_batch(int64_t m, int64_t dp_rank, int64_t dp_size, int64_t micro_batch_size) const;
  void advance(int64_t global_batch_size) { consumed_samples += global_batch_size; }
};

// tokens [B, S], labels [B, S] (tokens shifted by one), loss_mask [B, S] for the given samples: ones, but zero
// where the input token is `eod_mask_token` (Megatron's --eod-mask-loss; -1: none).
struct Batch {
  Tensor tokens, labels, loss_mask;
};
Batch make_batch(const SampleSource& src, const std::vector<int64_t>& samples, int64_t eod_mask_token = -1);

}  // namespace moecore::data
