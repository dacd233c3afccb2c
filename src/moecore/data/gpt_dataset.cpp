// GPT datasets (see gpt_dataset.h).
#include "moecore/data/gpt_dataset.h"

#include <cmath>
#include <numeric>
#include <sstream>

#include "moecore/core/error.h"
#include "moecore/core/rng.h"

namespace moecore::data {

namespace {
// Fisher-Yates driven by Philox: the same permutation for the same (seed, stream) everywhere.
void shuffle(std::vector<int64_t>& v, uint64_t seed, uint64_t stream) {
  const Philox rng(seed, stream);
  for (int64_t k = static_cast<int64_t>(v.size()) - 1; k > 0; k--) {
    const auto b = rng.block(static_cast<uint64_t>(k));
    const uint64_t r = ((static_cast<uint64_t>(b[0]) << 32) | b[1]) % static_cast<uint64_t>(k + 1);
    std::swap(v[static_cast<size_t>(k)], v[r]);
  }
}
}  // namespace

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> ds, int64_t doc_begin, int64_t doc_end,
                       int64_t num_samples, int64_t seq_length, uint64_t seed, const std::string& name)
    : ds_(std::move(ds)), seq_length_(seq_length) {
  MOE_CHECK(seq_length > 0, "--seq-length must be positive, got {}", seq_length);
  MOE_ASSERT(doc_begin >= 0 && doc_begin <= doc_end && doc_end <= ds_->num_documents());
  doc_tokens_.resize(static_cast<size_t>(ds_->num_documents()));
  for (int64_t d = doc_begin; d < doc_end; d++) {
    int64_t n = 0;
    for (int64_t s = ds_->document_index(d); s < ds_->document_index(d + 1); s++) n += ds_->sequence_length(s);
    doc_tokens_[static_cast<size_t>(d)] = n;
  }
  int64_t tokens_per_epoch = 0;
  for (int64_t d = doc_begin; d < doc_end; d++) tokens_per_epoch += doc_tokens_[static_cast<size_t>(d)];
  MOE_CHECK(tokens_per_epoch > 0, "{}: documents [{}, {}) of {} hold no tokens; adjust --split or the data", name,
            doc_begin, doc_end, ds_->prefix());
  // Enough epochs for num_samples samples of seq_length + 1 tokens that share their boundary token.
  const int64_t needed = num_samples * seq_length + 1;
  num_epochs_ = std::max<int64_t>(1, (needed + tokens_per_epoch - 1) / tokens_per_epoch);
  const uint64_t stream = stream_id(ds_->prefix() + "#" + name);
  for (int64_t e = 0; e < num_epochs_; e++) {
    std::vector<int64_t> order(static_cast<size_t>(doc_end - doc_begin));
    std::iota(order.begin(), order.end(), doc_begin);
    shuffle(order, seed, stream + 2 * static_cast<uint64_t>(e) + 1);
    doc_index_.insert(doc_index_.end(), order.begin(), order.end());
  }
  // Sample boundaries: every seq_length tokens of the stream.
  const int64_t total = num_epochs_ * tokens_per_epoch;
  const int64_t n_samples = (total - 1) / seq_length;
  sample_.reserve(static_cast<size_t>(n_samples + 1));
  int64_t pos = 0, off = 0;  // position in doc_index_, offset inside that document
  for (int64_t i = 0; i <= n_samples; i++) {
    // Skip empty documents and documents already consumed so that (pos, off) points at a real token.
    while (pos < static_cast<int64_t>(doc_index_.size()) && off >= doc_tokens_[doc_index_[pos]]) {
      off -= doc_tokens_[doc_index_[pos]];
      pos++;
    }
    sample_.emplace_back(pos, off);
    off += seq_length;
  }
  shuffle_.resize(static_cast<size_t>(n_samples));
  std::iota(shuffle_.begin(), shuffle_.end(), 0);
  shuffle(shuffle_, seed, stream);
}

void GPTDataset::read_document(int64_t doc, int64_t offset, int64_t length, int64_t* out) const {
  for (int64_t s = ds_->document_index(doc); s < ds_->document_index(doc + 1) && length > 0; s++) {
    const int64_t len = ds_->sequence_length(s);
    if (offset >= len) {
      offset -= len;
      continue;
    }
    const int64_t take = std::min(len - offset, length);
    ds_->read(s, offset, take, out);
    out += take;
    length -= take;
    offset = 0;
  }
}

void GPTDataset::get(int64_t i, int64_t* out) const {
  MOE_ASSERT(i >= 0 && i < size());
  auto [pos, off] = sample_[static_cast<size_t>(shuffle_[static_cast<size_t>(i)])];
  int64_t need = seq_length_ + 1;
  while (need > 0) {
    MOE_ASSERT(pos < static_cast<int64_t>(doc_index_.size()));
    const int64_t doc = doc_index_[pos];
    const int64_t take = std::min(doc_tokens_[doc] - off, need);
    read_document(doc, off, take, out);
    out += take;
    need -= take;
    pos++;
    off = 0;
  }
}

std::vector<int64_t> BlendedDataset::part_sizes(const std::vector<double>& weights, int64_t size) {
  std::vector<int64_t> n;
  for (double w : weights) n.push_back(static_cast<int64_t>(std::ceil(w * static_cast<double>(size) * 1.005)));
  return n;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> parts, std::vector<double> weights,
                               int64_t size)
    : parts_(std::move(parts)) {
  MOE_ASSERT(!parts_.empty() && parts_.size() == weights.size());
  std::vector<int64_t> count(parts_.size(), 0);
  which_.resize(static_cast<size_t>(size));
  index_.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; i++) {
    // Megatron's build_blending_indices: the part furthest below its target share takes the sample.
    size_t best = 0;
    double best_err = -1e300;
    for (size_t d = 0; d < parts_.size(); d++) {
      const double err = weights[d] * static_cast<double>(i + 1) - static_cast<double>(count[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    MOE_CHECK(count[best] < parts_[best]->size(), "blended dataset part {} has only {} samples", best,
              parts_[best]->size());
    which_[static_cast<size_t>(i)] = static_cast<int32_t>(best);
    index_[static_cast<size_t>(i)] = count[best]++;
  }
}

void BlendedDataset::get(int64_t i, int64_t* out) const {
  parts_[static_cast<size_t>(which_[static_cast<size_t>(i)])]->get(index_[static_cast<size_t>(i)], out);
}

MockGPTDataset::MockGPTDataset(int64_t size, int64_t seq_length, int64_t vocab_size, uint64_t seed)
    : size_(size), seq_length_(seq_length), vocab_(vocab_size), seed_(seed) {
  MOE_CHECK(vocab_size > 0, "--mock-data needs a vocabulary size (--vocab-size or a tokenizer)");
}

void MockGPTDataset::get(int64_t i, int64_t* out) const {
  const Philox rng(seed_, stream_id("mock-data"));
  for (int64_t j = 0; j <= seq_length_; j++)
    out[j] = static_cast<int64_t>(rng.block(static_cast<uint64_t>(i * (seq_length_ + 1) + j))[0] %
                                  static_cast<uint64_t>(vocab_));
}

std::array<double, 3> parse_split(const std::string& split) {
  std::array<double, 3> f{0, 0, 0};
  std::string s = split;
  for (char& c : s)
    if (c == '/') c = ',';
  std::stringstream ss(s);
  std::string part;
  int n = 0;
  double sum = 0;
  while (std::getline(ss, part, ',')) {
    MOE_CHECK(n < 3, "--split {} has more than three parts (train, valid, test)", split);
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    MOE_CHECK(!part.empty() && end && *end == '\0' && v >= 0, "--split {}: '{}' is not a non-negative number", split,
              part);
    f[static_cast<size_t>(n++)] = v;
    sum += v;
  }
  MOE_CHECK(sum > 0, "--split {} must have a positive part", split);
  for (double& v : f) v /= sum;
  return f;
}

std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& f, int64_t n) {
  std::array<int64_t, 4> b{0, 0, 0, 0};
  // Python's round() ties to even, as nearbyint does in the default rounding mode.
  for (size_t i = 0; i < 3; i++) b[i + 1] = b[i] + static_cast<int64_t>(std::nearbyint(f[i] * static_cast<double>(n)));
  const int64_t diff = b[3] - n;  // rounding drift, taken off every boundary after the first (Megatron's rule)
  for (size_t i = 1; i < 4; i++) b[i] -= diff;
  return b;
}

std::pair<std::vector<double>, std::vector<std::string>> parse_data_path(const std::vector<std::string>& words) {
  MOE_CHECK(!words.empty(), "--data-path is empty");
  if (words.size() == 1) return {{1.0}, {words[0]}};
  MOE_CHECK(words.size() % 2 == 0,
            "--data-path with several datasets takes weight/prefix pairs (\"0.3 prefixA 0.7 prefixB\"); got {} words",
            words.size());
  std::vector<double> w;
  std::vector<std::string> p;
  double sum = 0;
  for (size_t i = 0; i < words.size(); i += 2) {
    char* end = nullptr;
    const double v = std::strtod(words[i].c_str(), &end);
    MOE_CHECK(end && *end == '\0' && v > 0, "--data-path: '{}' (before {}) is not a positive weight", words[i],
              words[i + 1]);
    w.push_back(v);
    p.push_back(words[i + 1]);
    sum += v;
  }
  for (double& v : w) v /= sum;
  return {w, p};
}

std::array<std::shared_ptr<const SampleSource>, 3> build_gpt_datasets(const std::vector<std::string>& data_path,
                                                                      const std::string& split, int64_t seq_length,
                                                                      const std::array<int64_t, 3>& num_samples,
                                                                      uint64_t seed) {
  const auto [weights, prefixes] = parse_data_path(data_path);
  const auto fractions = parse_split(split);
  const char* names[3] = {"train", "valid", "test"};
  std::vector<std::shared_ptr<const IndexedDataset>> opened;
  for (const auto& p : prefixes) opened.push_back(std::make_shared<IndexedDataset>(p));
  std::array<std::shared_ptr<const SampleSource>, 3> out;
  for (size_t s = 0; s < 3; s++) {
    if (num_samples[s] <= 0 || fractions[s] == 0) continue;
    const auto sizes = prefixes.size() == 1 ? std::vector<int64_t>{num_samples[s]}
                                            : BlendedDataset::part_sizes(weights, num_samples[s]);
    std::vector<std::shared_ptr<const SampleSource>> parts;
    for (size_t d = 0; d < prefixes.size(); d++) {
      const auto b = split_boundaries(fractions, opened[d]->num_documents());
      MOE_CHECK(b[s + 1] > b[s], "--split {} leaves the {} split of {} without documents ({} documents in all)", split,
                names[s], prefixes[d], opened[d]->num_documents());
      parts.push_back(std::make_shared<GPTDataset>(opened[d], b[s], b[s + 1], sizes[d], seq_length, seed, names[s]));
    }
    out[s] = parts.size() == 1 ? parts[0] : std::make_shared<BlendedDataset>(parts, weights, num_samples[s]);
  }
  return out;
}

std::vector<int64_t> SampleCursor::micro_batch(int64_t m, int64_t dp_rank, int64_t dp_size,
                                               int64_t micro_batch_size) const {
  std::vector<int64_t> idx;
  const int64_t base = consumed_samples + m * micro_batch_size * dp_size + dp_rank * micro_batch_size;
  for (int64_t i = 0; i < micro_batch_size; i++) idx.push_back(base + i);
  return idx;
}

Batch make_batch(const SampleSource& src, const std::vector<int64_t>& samples, int64_t eod_mask_token) {
  const int64_t B = static_cast<int64_t>(samples.size()), S = src.seq_length();
  Batch b{Tensor::empty({B, S}, DType::I64), Tensor::empty({B, S}, DType::I64), Tensor::empty({B, S}, DType::F32)};
  std::vector<int64_t> buf(static_cast<size_t>(S + 1));
  for (int64_t r = 0; r < B; r++) {
    MOE_CHECK(samples[static_cast<size_t>(r)] < src.size(),
              "sample {} requested but the dataset has {}; raise the number of samples built (train iterations)",
              samples[static_cast<size_t>(r)], src.size());
    src.get(samples[static_cast<size_t>(r)], buf.data());
    for (int64_t s = 0; s < S; s++) {
      b.tokens.data<int64_t>()[r * S + s] = buf[static_cast<size_t>(s)];
      b.labels.data<int64_t>()[r * S + s] = buf[static_cast<size_t>(s + 1)];
      b.loss_mask.data<float>()[r * S + s] = buf[static_cast<size_t>(s)] == eod_mask_token ? 0.0f : 1.0f;
    }
  }
  return b;
}

}  // namespace moecore::data
