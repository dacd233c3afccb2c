// Megatron's parameter-and-gradient buffers (optim/grad_buffer.h): one bucket per layer, or --ddp-bucket-size's
// buckets filled in the order gradients become final and closed at a parameter boundary once full; every gradient
// (and with parameter buffers every value, bf16 where stored so) a view into its bucket; a bucket completes once
// all its layers are reported.
#include <gtest/gtest.h>

#include "moecore/optim/grad_buffer.h"
#include "test_util.h"

namespace moecore {
namespace {

// Three layers of two parameters (a bf16-stored weight of 6 elements, an f32 norm of 2), and the embedding (4).
struct BufferModel {
  nn::ParamRegistry reg;
  std::vector<nn::Parameter*> params;
  BufferModel() {
    for (int l = 0; l < 3; l++) {
      nn::Parameter& w = reg.add("decoder.layers." + std::to_string(l) + ".w", {2, 3}, nn::InitRule::normal(1.0));
      w.low_storage = DType::BF16;
      reg.add("decoder.layers." + std::to_string(l) + ".norm", {2}, nn::InitRule::ones());
    }
    reg.add("embedding.weight", {4}, nn::InitRule::normal(1.0));
    reg.initialize(7);
    for (auto& p : reg.all()) params.push_back(p.get());
  }
  static size_t layer(const nn::Parameter& p) {
    const std::string pre = "decoder.layers.";
    return p.name.rfind(pre, 0) == 0 ? static_cast<size_t>(p.name[pre.size()] - '0') : 3;
  }
};

TEST(GradBuffer, OneBucketPerLayerHoldsTheGradientsAsViews) {
  BufferModel m;
  optim::BufferLayout o;
  o.num_layers = 3;
  o.bucket_of = BufferModel::layer;
  std::vector<optim::BufferBucket> b = optim::make_buckets(m.params, o);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; i++) EXPECT_EQ(b[i].layers, std::vector<size_t>{i});
  EXPECT_EQ(b[0].numel, 8);
  m.params[1]->grad.set_item(1, 5.0);  // layer 0's norm: after its weight in the bucket
  EXPECT_EQ(b[0].grad.item(6 + 1), 5.0);
  EXPECT_EQ(optim::complete_buckets(b, 2), std::vector<size_t>{2});
}

TEST(GradBuffer, BucketSizeFillsInFinalOrderAndClosesAtParameterBoundaries) {
  BufferModel m;
  optim::BufferLayout o;
  o.num_layers = 3;
  o.bucket_of = BufferModel::layer;
  o.bucket_size = 10;
  std::vector<optim::BufferBucket> b = optim::make_buckets(m.params, o);
  // Final order: layer 2 (8), layer 1 (8), layer 0 (8), the embedding (4): closed once ≥ 10 after a parameter.
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].numel, 14);  // layer 2's w, norm, then layer 1's w: 8 + 6 ≥ 10
  EXPECT_EQ(b[0].layers, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(b[1].numel, 10);  // layer 1's norm, layer 0's w and norm
  EXPECT_EQ(b[1].layers, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(b[2].numel, 4);
  for (const auto& bk : b)
    if (&bk != &b.back()) EXPECT_GE(bk.numel, 10);
  // A bucket starts once every layer in it is final.
  EXPECT_TRUE(optim::complete_buckets(b, 2).empty());
  EXPECT_EQ(optim::complete_buckets(b, 1), std::vector<size_t>{0});
  EXPECT_EQ(optim::complete_buckets(b, 0), std::vector<size_t>{1});
  EXPECT_EQ(optim::complete_buckets(b, 3), std::vector<size_t>{2});
  optim::reset_pending(b);
  EXPECT_TRUE(optim::complete_buckets(b, 2).empty());
}

TEST(GradBuffer, ParameterBuffersHoldBf16AndF32ValuesApartPadded) {
  BufferModel m;
  std::vector<Tensor> f32;
  for (auto* p : m.params) f32.push_back(p->value.clone());
  optim::BufferLayout o;
  o.num_layers = 3;
  o.bucket_of = BufferModel::layer;
  o.shards = 4;
  o.param_buffers = true;
  std::vector<optim::BufferBucket> b = optim::make_buckets(m.params, o);
  ASSERT_EQ(b.size(), 7u);  // three bf16 buckets (the weights), four f32 (norms, embedding)
  for (size_t i = 0; i < 3; i++) EXPECT_EQ(b[i].storage, DType::BF16);
  EXPECT_EQ(b[0].padded, 8);  // 6 padded to a multiple of 4
  for (size_t i = 0; i < m.params.size(); i++) {
    const nn::Parameter& p = *m.params[i];
    EXPECT_EQ(p.value.dtype(), p.low_storage.value_or(DType::F32)) << p.name;
    EXPECT_TRUE(testing::bitwise_equal(p.value, f32[i].to(p.value.dtype()))) << p.name << ": rounded where bf16";
  }
  m.params[0]->value.copy_from(Tensor::zeros({2, 3}, DType::F32));
  EXPECT_EQ(b[0].param.item(0), 0.0);  // the value is a view
}

}  // namespace
}  // namespace moecore
