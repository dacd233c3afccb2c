// Native checkpoint model state: shards written under one layout load under another (row split -> whole ->
// column split, experts over "EP ranks" -> one rank), and broken checkpoints are refused listing every problem; the
// --verify-integrity manifest names changed and missing files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/manager.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

std::string ckpt_dir(const std::string& name) {
  const std::string p = testing::fresh_temp_path("ckpt_" + name);
  fs::create_directories(p);
  return p;
}

// A "rank" holding the box of w [4, 6] given by offset/size, and experts [E=4, 3, 2] split over `ep` ranks.
struct FakeRank {
  nn::ParamRegistry reg;
  FakeRank(std::vector<int64_t> off, Shape size, int64_t ep, int64_t ep_rank) {
    nn::Parameter& w = reg.add("w", size, nn::InitRule::normal(1.0));
    if (!(size == Shape{4, 6})) w.set_shard({4, 6}, off, size);
    const int64_t n = 4 / ep;
    nn::Parameter& e = reg.add("layer.mlp.experts.linear_fc1.weight", {n, 3, 2}, nn::InitRule::normal(1.0));
    e.set_shard({4, 3, 2}, {ep_rank * n, 0, 0}, {n, 3, 2});
    reg.initialize(5);  // values by global index: every layout holds the same global tensors
  }
  std::vector<const nn::Parameter*> params() const {
    std::vector<const nn::Parameter*> v;
    for (auto& p : reg.all()) v.push_back(p.get());
    return v;
  }
};

using testing::error_of;

TEST(Checkpoint, ReshardsAcrossLayouts) {
  const std::string dir = ckpt_dir("reshard");
  FakeRank r0({0, 0}, {2, 6}, 2, 0), r1({2, 0}, {2, 6}, 2, 1);  // TP rows 2 x EP 2
  ckpt::write_model_shards(dir, 0, r0.params());
  ckpt::write_model_shards(dir, 1, r1.params());
  ckpt::write_model_index(dir, 2);
  FakeRank whole({0, 0}, {4, 6}, 1, 0);  // one rank: the reference values
  for (auto [off, size] :
       {std::pair<std::vector<int64_t>, Shape>{{0, 0}, {4, 6}}, {{0, 3}, {4, 3}}, {{1, 2}, {2, 4}}}) {
    FakeRank target(off, size, 1, 0);
    for (auto& p : target.reg.all()) p->value.zero_();
    ckpt::load_model(dir, target.reg);
    FakeRank expect(off, size, 1, 0);
    for (size_t i = 0; i < target.reg.all().size(); i++) {
      const Tensor& a = target.reg.all()[i]->value;
      const Tensor& b = expect.reg.all()[i]->value;
      for (int64_t j = 0; j < a.numel(); j++) ASSERT_EQ(a.item(j), b.item(j)) << target.reg.all()[i]->name;
    }
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, RefusesBrokenCheckpointsListingEveryProblem) {
  const std::string dir = ckpt_dir("broken");
  FakeRank r0({0, 0}, {2, 6}, 2, 0), r1({2, 0}, {2, 6}, 2, 1);
  // A missing rank: its rows of w and experts 2 and 3 are absent.
  ckpt::write_model_shards(dir, 0, r0.params());
  std::string e = error_of([&] { ckpt::write_model_index(dir, 2); });
  EXPECT_NE(e.find("rank 1 wrote no index fragment"), std::string::npos) << e;
  EXPECT_NE(e.find("w: missing elements of global shape [4, 6] at index 2, 3"), std::string::npos) << e;
  EXPECT_NE(e.find("experts.linear_fc1.weight: missing elements of global shape [4, 3, 2] at index 2, 3 of its "
                   "first dimension (experts)"),
            std::string::npos)
      << e;
  // A duplicated expert: rank 1 writes rank 0's shards again.
  ckpt::write_model_shards(dir, 1, r0.params());
  e = error_of([&] { ckpt::write_model_index(dir, 2); });
  EXPECT_NE(e.find("duplicated elements"), std::string::npos) << e;
  // A valid checkpoint, then a corrupted shard file: the checksum names it.
  ckpt::write_model_shards(dir, 1, r1.params());
  ckpt::write_model_index(dir, 2);
  {
    std::fstream f(dir + "/model_rank00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  FakeRank whole({0, 0}, {4, 6}, 1, 0);
  e = error_of([&] { ckpt::load_model(dir, whole.reg); });
  EXPECT_NE(e.find("checksum mismatch in model_rank00001.safetensors"), std::string::npos) << e;
  // A model whose shapes differ from the checkpoint's.
  nn::ParamRegistry other;
  other.add("w", {4, 7}, nn::InitRule::zeros());
  e = error_of([&] { ckpt::load_model(dir, other); });
  EXPECT_NE(e.find("w: the checkpoint's global shape [4, 6] differs from the model's [4, 7]"), std::string::npos) << e;
  fs::remove_all(dir);
  EXPECT_NE(error_of([&] { ckpt::read_model_index(dir); }).find("no index.json"), std::string::npos);
}

// --verify-integrity's manifest: every other file (subdirectories too) listed; an intact directory verifies; a
// changed byte, a missing file and a missing manifest are each refused by name.
TEST(Checkpoint, IntegrityManifestNamesChangedAndMissingFiles) {
  const std::string dir = ckpt_dir("integrity");
  fs::create_directories(dir + "/sub");
  for (const char* name : {"a.bin", "b.json", "sub/c.bin"}) std::ofstream(dir + "/" + name) << "content of " << name;
  ckpt::write_integrity_manifest(dir);
  std::ifstream in(dir + "/" + ckpt::kIntegrityFile);
  const std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* name : {"\"a.bin\"", "\"b.json\"", "\"sub/c.bin\"", "\"xxh3_64\""})
    EXPECT_NE(manifest.find(name), std::string::npos) << name << " not in " << manifest;
  EXPECT_EQ(manifest.find("integrity.json\":"), std::string::npos) << "the manifest lists itself";
  ckpt::verify_integrity_manifest(dir);                         // intact
  std::ofstream(dir + "/sub/c.bin") << "content of sub/c.biN";  // same size, one byte changed
  fs::remove(dir + "/a.bin");
  std::string e = error_of([&] { ckpt::verify_integrity_manifest(dir); });
  EXPECT_NE(e.find("failed for 2 file(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("a.bin: file missing"), std::string::npos) << e;
  EXPECT_NE(e.find("sub/c.bin: hash mismatch"), std::string::npos) << e;
  EXPECT_EQ(e.find("b.json"), std::string::npos) << e;
  fs::remove(dir + "/" + ckpt::kIntegrityFile);
  e = error_of([&] { ckpt::verify_integrity_manifest(dir); });
  EXPECT_NE(e.find("integrity manifest not found at " + dir + "/integrity.json"), std::string::npos) << e;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moecore
