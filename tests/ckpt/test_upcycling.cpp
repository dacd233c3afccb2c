// Upcycling (--moe-use-upcycling, reference §1.14): a trained dense checkpoint becomes an MoE model whose logits
// equal the dense model's at granularity 1 (SwiGLU, top-2 of 4 identical experts) and at granularity 2 with
// squared ReLU (each expert a scaled half of the FFN, the two halves of a replica routed together); the upcycled
// model is saved to --save and later runs resume it from there; an MoE checkpoint or mismatched flags are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "config_util.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::operator+;

std::string upcycle_dir(const std::string& name) {
  return testing::fresh_temp_path("upcycle_" + name);
}

// A dense model (FFN 64, activation `act`), or with `extra` an MoE model cut from it.
train::TrainConfig upcycle_config(const std::vector<std::string>& act, const std::vector<std::string>& extra) {
  const std::vector<std::string> dense{
      "--num-layers",      "2", "--hidden-size", "32", "--num-attention-heads", "4", "--disable-bias-linear",
      "--ffn-hidden-size", "64"};
  return testing::small_config(dense + testing::mock_run_flags(16, 2, 2, 64, 8, "3e-3") + act, extra);
}

std::vector<double> logits(train::Trainer& t) {
  Tensor tok = Tensor::empty({1, 16}, DType::I64);
  for (int64_t i = 0; i < 16; i++) tok.data<int64_t>()[i] = (i * 7 + 3) % 64;
  const Tensor l = t.model().logits(tok);
  std::vector<double> v;
  for (int64_t i = 0; i < l.numel(); i++) v.push_back(l.item(i));
  return v;
}

double upcycle_max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); i++) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}

struct UpcycleCase {
  std::string name;
  std::vector<std::string> act;  // FFN activation flags
  int64_t granularity, moe_ffn;
};

void PrintTo(const UpcycleCase& c, std::ostream* os) {
  *os << c.name;
}

class Upcycling : public ::testing::TestWithParam<UpcycleCase> {};

TEST_P(Upcycling, MoEOutputsEqualTheDenseModel) {
  const UpcycleCase& c = GetParam();
  const std::string dense_dir = upcycle_dir(c.name + "_dense"), moe_dir = upcycle_dir(c.name + "_moe");
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<double> want;
  {
    train::Trainer dense(upcycle_config(c.act, {"--save", dense_dir}), null, false);
    for (int i = 0; i < 3; i++) dense.train_step();  // trained weights, not the init
    dense.save_checkpoint();
    want = logits(dense);
  }
  const std::vector<std::string> moe{"--num-experts",
                                     "4",
                                     "--moe-router-topk",
                                     std::to_string(c.granularity == 1 ? 2 : c.granularity),
                                     "--moe-ffn-hidden-size",
                                     std::to_string(c.moe_ffn),
                                     "--moe-use-upcycling",
                                     "--moe-upcycling-granularity",
                                     std::to_string(c.granularity),
                                     "--load",
                                     dense_dir,
                                     "--save",
                                     moe_dir};
  {
    train::Trainer up(upcycle_config(c.act, moe), null, false);
    EXPECT_EQ(up.loaded_from(), dense_dir + "/iter_0000003");
    EXPECT_EQ(up.iteration(), 0);
    EXPECT_LT(upcycle_max_rel(logits(up), want), 1e-5) << "upcycled logits vs the dense model's";
    up.train_step();  // and it trains
    up.save_checkpoint();
  }
  // A second run resumes the upcycled model from --save instead of upcycling again.
  train::Trainer again(upcycle_config(c.act, moe), null, false);
  EXPECT_EQ(again.iteration(), 1);
  EXPECT_EQ(again.loaded_from(), moe_dir + "/iter_0000001");
  std::fclose(null);
  fs::remove_all(dense_dir);
  fs::remove_all(moe_dir);
}

INSTANTIATE_TEST_SUITE_P(Granularity, Upcycling,
                         ::testing::Values(UpcycleCase{"swiglu_g1", {"--swiglu"}, 1, 64},
                                           UpcycleCase{"squared_relu_g2", {"--squared-relu"}, 2, 32}),
                         [](const auto& info) { return info.param.name; });

TEST(Upcycling, RefusesAnMoECheckpointAndMismatchedFlags) {
  const std::string moe_dir = upcycle_dir("already_moe");
  std::FILE* null = std::fopen("/dev/null", "w");
  const std::vector<std::string> moe{"--swiglu", "--num-experts", "4", "--moe-ffn-hidden-size", "64"};
  {
    train::Trainer t(upcycle_config(moe, {"--save", moe_dir}), null, false);
    t.save_checkpoint();
  }
  std::string e = error_of([&] {
    train::Trainer(upcycle_config(moe, {"--moe-use-upcycling", "--load", moe_dir, "--save", upcycle_dir("x")}), null,
                   false);
  });
  EXPECT_NE(e.find("already an MoE checkpoint"), std::string::npos) << e;
  e = error_of([&] {
    upcycle_config({"--swiglu"}, {"--num-experts", "4", "--moe-ffn-hidden-size", "64", "--moe-use-upcycling",
                                  "--moe-upcycling-granularity", "2", "--load", moe_dir, "--save", "x"});
  });
  EXPECT_NE(e.find("set --moe-ffn-hidden-size 32"), std::string::npos) << e;
  std::fclose(null);
  fs::remove_all(moe_dir);
}

}  // namespace
}  // namespace moecore
