// Megatron-LM checkpoints where moecore expects its own: recognised by their files (torch_dist's metadata.json,
// .metadata, common.pt and .distcp shards; torch.distributed.checkpoint's .metadata and shards; the legacy torch
// format's mp_rank_XX/model_optim_rng.pt) and refused by find_checkpoint (--load) naming them and the way over.
// moecore's own checkpoints, empty and missing directories are not recognised as foreign.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moecore/ckpt/foreign_checkpoint.h"
#include "moecore/ckpt/manager.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

void touch(const fs::path& file, const std::string& content = "") {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << content;
}

// A Megatron torch_dist save of iteration `it` under `root`, two ranks' shards, and the marker naming it.
void megatron_torch_dist(const fs::path& root, int it) {
  const fs::path dir = root / fmt::format("iter_{:07d}", it);
  touch(dir / "metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  touch(dir / ".metadata");
  touch(dir / "common.pt");
  touch(dir / "__0_0.distcp");
  touch(dir / "__1_0.distcp");
  touch(root / ckpt::kLatestFile, std::to_string(it));
}

TEST(ForeignCheckpoint, MegatronTorchDistIsNamedAndRefusedWithTheWayOver) {
  const fs::path root = testing::fresh_temp_path("foreign_torch_dist");
  megatron_torch_dist(root, 5);
  megatron_torch_dist(root, 10);
  EXPECT_EQ(ckpt::describe_foreign_checkpoint(root.string()),
            "a Megatron-LM torch_dist checkpoint (iter_0000010/ with metadata.json, .metadata, common.pt, 2 .distcp "
            "files)");
  EXPECT_EQ(ckpt::describe_foreign_checkpoint((root / "iter_0000005").string() + "/"),
            "a Megatron-LM torch_dist checkpoint (iter_0000005/ with metadata.json, .metadata, common.pt, 2 .distcp "
            "files)");
  for (int64_t step : {-1, 5}) {  // the root's marker, or --ckpt-step
    const std::string e = testing::user_error_of([&] { ckpt::find_checkpoint(root.string(), step); });
    EXPECT_EQ(e.rfind("--load " + root.string() + " holds a Megatron-LM torch_dist checkpoint (iter_0000010/", 0), 0u)
        << e;
    EXPECT_NE(e.find("not a moecore checkpoint"), std::string::npos) << e;
    EXPECT_NE(e.find("moecore convert hf-to-native --input HF_DIR --output DIR"), std::string::npos) << e;
  }
  const std::string e = testing::user_error_of([&] { ckpt::find_checkpoint((root / "iter_0000005").string()); });
  EXPECT_NE(e.find("holds a Megatron-LM torch_dist checkpoint (iter_0000005/"), std::string::npos) << e;
}

TEST(ForeignCheckpoint, TorchDcpAndLegacyTorchAreNamed) {
  const fs::path dcp = testing::fresh_temp_path("foreign_dcp") + "/iter_0000003";
  touch(dcp / ".metadata");
  touch(dcp / "__0_0.distcp");
  EXPECT_EQ(ckpt::describe_foreign_checkpoint(dcp.parent_path().string()),
            "a torch.distributed.checkpoint (Megatron-LM's torch_dist, torch_dcp or fsdp_dtensor) checkpoint "
            "(iter_0000003/ with .metadata, 1 .distcp file)");
  const fs::path legacy = testing::fresh_temp_path("foreign_legacy");
  touch(legacy / "iter_0000007/mp_rank_01/model_optim_rng.pt");
  touch(legacy / "iter_0000007/mp_rank_00/model_optim_rng.pt");
  touch(legacy / ckpt::kLatestFile, "7");
  EXPECT_EQ(ckpt::describe_foreign_checkpoint(legacy.string()),
            "a Megatron-LM torch checkpoint (--ckpt-format torch: iter_0000007/mp_rank_00/model_optim_rng.pt)");
  const std::string e = testing::user_error_of([&] { ckpt::find_checkpoint(legacy.string()); });
  EXPECT_NE(e.find("iter_0000007/mp_rank_00/model_optim_rng.pt"), std::string::npos) << e;
}

TEST(ForeignCheckpoint, MoecoresOwnEmptyAndMissingDirectoriesAreNotForeign) {
  const fs::path root = testing::fresh_temp_path("foreign_none");
  fs::create_directories(root);
  EXPECT_EQ(ckpt::describe_foreign_checkpoint(root.string()), std::nullopt);
  EXPECT_EQ(testing::error_of([&] { EXPECT_FALSE(ckpt::find_checkpoint(root.string()).has_value()); }), "");
  EXPECT_EQ(ckpt::describe_foreign_checkpoint((root / "missing").string()), std::nullopt);
  // An index.json makes a directory moecore's own, whatever else lies there.
  touch(root / "iter_0000002/index.json", "{}");
  touch(root / "iter_0000002/.metadata");
  EXPECT_EQ(ckpt::describe_foreign_checkpoint(root.string()), std::nullopt);
  // Megatron's directory names without its files.
  touch(root / "iter_0000004/mp_rank_00/other.pt");
  EXPECT_EQ(ckpt::describe_foreign_checkpoint(root.string()), std::nullopt);
}

}  // namespace
}  // namespace moecore
