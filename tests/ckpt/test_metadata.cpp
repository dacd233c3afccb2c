// Checkpoint metadata you can trust: hand edits of train_state.json and index.json are caught
// by their checksums, and edits that keep a valid checksum by field validation, each naming the file and field;
// the marker stays Megatron's plain integer with its checksum in a sidecar, and a marker moved by hand is refused;
// iteration directories without a marker are listed and --ckpt-step chooses; .tmp and incomplete directories are
// refused by name; a save never replaces complete checkpoints the run did not load, and one killed between the
// rename of its directory and the marker's update (its commit) is set aside (iter_N.uncommitted-<k>) by the next
// --load D --save D, which trains on from the marker; --save is checked writable with room for a checkpoint. Every
// refusal leaves every file as it was.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ckpt_fixture.h"
#include "moecore/ckpt/manager.h"
#include "moecore/ckpt/metadata.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::digest;
using testing::error_of;

// The root of a run with complete checkpoints at iterations 2 and 4 (made once, copied per test).
std::string run_with_checkpoints(const std::string& name) {
  static const std::string master = [] {
    const std::string m = testing::own_temp_path("meta_master");
    testing::make_checkpoints(m, {2, 4});
    return m;
  }();
  const std::string dir = testing::own_temp_path("meta_" + name);
  fs::copy(master, dir, fs::copy_options::recursive);
  return dir;
}

// Rewrites the JSON file `path` through `edit`; `rechecksum`: as a tool that knows the format would (the checksum
// then matches and only field validation can catch the edit).
template <typename Edit>
void edit_json(const std::string& path, Edit edit, bool rechecksum) {
  nlohmann::json j = nlohmann::json::parse(read_file(path, "test"));
  edit(j);
  std::ofstream(path) << (rechecksum ? ckpt::metadata_text(j) : j.dump(1));
}

std::string state_of(const std::string& root, int64_t it) {
  return ckpt::iteration_dir(root, it) + "/" + ckpt::kStateFile;
}

TEST(CheckpointMetadata, StateEditsAreCaughtNamingFileAndField) {
  const std::string root = run_with_checkpoints("state");
  const std::string sp = state_of(root, 4);
  const std::string original = read_file(sp, "test");
  EXPECT_EQ(nlohmann::json::parse(original).at("format"), ckpt::kTrainStateFormat);
  // A hand edit: the checksum no longer matches.
  edit_json(
      sp, [](auto& j) { j["consumed_samples"] = -8; }, false);
  testing::NullOut null;
  std::string e = error_of([&] { train::Trainer(testing::ckpt_config({"--load", root}), null.f, false); });
  EXPECT_TRUE(contains(e, sp + ": checksum mismatch")) << e;
  EXPECT_TRUE(contains(e, "--ckpt-step N")) << e;
  // The same edit with the checksum recomputed: field validation names the field (it used to reach an assertion).
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases{
      {[](auto& j) { j["consumed_samples"] = -8; }, "field 'consumed_samples' is -8, expected an integer >= 0"},
      {[](auto& j) { j["consumed_samples"] = 20; },
       "field 'consumed_samples' is 20, but the run saving it started at iteration 0 with 0 samples consumed and took "
       "4 per iteration (--global-batch-size): 16 expected at iteration 4"},
      {[](auto& j) { j["iteration"] = 3; }, "field 'iteration' is 3, but the directory is iter_0000004"},
      {[](auto& j) { j["iteration"] = "4"; }, "field 'iteration' is \"4\", expected an integer"},
      {[](auto& j) { j["optimizer"] = 1; }, "field 'optimizer' is 1, expected true or false"},
      {[](auto& j) { j["layout"]["tp"] = 0; }, "field 'layout.tp' is 0, expected an integer in [1, 1]"},
      {[](auto& j) { j["vocab"]["padded"] = 64; }, "field 'vocab.padded' is 64, expected an integer >= 100"},
      {[](auto& j) { j["vocab"]["padded"] = 256; }, "field 'vocab.padded' is 256, but index.json stores"},
      {[](auto& j) { j["log_interval_sums"]["steps"] = -1; }, "field 'log_interval_sums.steps' is -1"},
      {[](auto& j) { j.erase("rng"); }, "field 'rng' is missing"},
      {[](auto& j) { j["format"] = "moecore-train-state-9"; }, "field 'format' is 'moecore-train-state-9'"},
  };
  for (const auto& c : cases) {
    std::ofstream(sp) << original;
    edit_json(sp, c.edit, true);
    e = error_of([&] { ckpt::find_checkpoint(root); });
    EXPECT_TRUE(contains(e, sp + ": ")) << e;
    EXPECT_TRUE(contains(e, c.needle)) << e;
  }
  std::ofstream(sp) << original;
  EXPECT_EQ(ckpt::find_checkpoint(root)->dir, ckpt::iteration_dir(root, 4));
  fs::remove_all(root);
}

TEST(CheckpointMetadata, IndexEditsAreCaught) {
  const std::string root = run_with_checkpoints("index");
  const std::string ip = ckpt::iteration_dir(root, 4) + "/index.json";
  EXPECT_EQ(nlohmann::json::parse(read_file(ip, "test")).at("format"), ckpt::kIndexFormat);
  edit_json(
      ip, [](auto& j) { j["shards"][0]["xxh3_64"] = "0000000000000000"; }, false);
  const std::string e = error_of([&] { ckpt::find_checkpoint(root); });
  EXPECT_TRUE(contains(e, ip + ": checksum mismatch")) << e;
  fs::remove_all(root);
}

TEST(CheckpointMetadata, ExtraFilesAreCheckedAgainstTheState) {
  const std::string root = run_with_checkpoints("files");
  const std::string dir = ckpt::iteration_dir(root, 4);
  const std::string content = "{\"model\": {}}";
  std::ofstream(dir + "/tokenizer.json") << content;
  edit_json(
      state_of(root, 4),
      [&](auto& j) {
        j["files"]["tokenizer.json"] = fmt::format("{:016x}", XXH3_64bits(content.data(), content.size()));
      },
      true);
  EXPECT_TRUE(ckpt::find_checkpoint(root));
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": []}";
  std::string e = error_of([&] { ckpt::find_checkpoint(root); });
  EXPECT_TRUE(contains(e, dir + "/tokenizer.json: checksum mismatch (recorded in " + state_of(root, 4))) << e;
  fs::remove(dir + "/tokenizer.json");
  e = error_of([&] { ckpt::find_checkpoint(root); });
  EXPECT_TRUE(contains(e, "field 'files.tokenizer.json' names a file that is not in " + dir)) << e;
  fs::remove_all(root);
}

TEST(CheckpointMetadata, OlderFormatsAreReadWithFieldsValidated) {
  const std::string root = run_with_checkpoints("legacy");
  edit_json(
      state_of(root, 4),
      [](auto& j) {
        j.erase("checksum");
        j.erase("run_start");
        j["format"] = ckpt::kTrainStateFormatV1;
      },
      false);
  edit_json(
      ckpt::iteration_dir(root, 4) + "/index.json",
      [](auto& j) {
        j.erase("checksum");
        j["format"] = ckpt::kIndexFormatV1;
      },
      false);
  const auto f = ckpt::find_checkpoint(root);
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->legacy);
  EXPECT_TRUE(contains(f->note, "older format moecore-train-state-1")) << f->note;
  testing::NullOut null;
  train::Trainer t(testing::ckpt_config({"--load", root}), null.f, false);
  EXPECT_EQ(t.iteration(), 4);
  // Format 1 without a checksum still has its fields checked.
  edit_json(
      state_of(root, 4), [](auto& j) { j["consumed_samples"] = -8; }, false);
  const std::string e = error_of([&] { ckpt::find_checkpoint(root); });
  EXPECT_TRUE(contains(e, "field 'consumed_samples' is -8")) << e;
  fs::remove_all(root);
}

TEST(CheckpointMetadata, MarkerStaysMegatronsWithAChecksummedSidecar) {
  const std::string root = run_with_checkpoints("marker");
  const std::string marker = root + "/" + ckpt::kLatestFile, sidecar = root + "/" + ckpt::kMarkerSidecar;
  EXPECT_EQ(read_file(marker, "test"), "4");  // what Megatron's tools read
  const nlohmann::json s = nlohmann::json::parse(read_file(sidecar, "test"));
  EXPECT_EQ(s.at("format"), ckpt::kMarkerFormat);
  EXPECT_EQ(s.at("marker"), "4");
  // Moved back by hand: refused, naming both files and the way to choose.
  std::ofstream(marker) << "2";
  const auto before = digest(root);
  std::string e = error_of([&] { ckpt::find_checkpoint(root); });
  EXPECT_TRUE(contains(e, marker + " says '2' but " + sidecar + " records that moecore last wrote '4'")) << e;
  EXPECT_TRUE(contains(e, "--ckpt-step N (complete there: iter_0000002, iter_0000004)")) << e;
  EXPECT_EQ(digest(root), before);
  // --ckpt-step chooses whatever the marker says.
  EXPECT_EQ(ckpt::find_checkpoint(root, 2)->dir, ckpt::iteration_dir(root, 2));
  // A save interrupted between the marker and its sidecar: the marker names the newer complete checkpoint.
  std::ofstream(marker) << "4";
  edit_json(
      sidecar, [](auto& j) { j["marker"] = "2"; }, true);
  const auto f = ckpt::find_checkpoint(root);
  EXPECT_EQ(f->dir, ckpt::iteration_dir(root, 4));
  EXPECT_TRUE(contains(f->note, "one save behind")) << f->note;
  // The sidecar edited by hand.
  edit_json(
      sidecar, [](auto& j) { j["marker"] = "6"; }, false);
  e = error_of([&] { ckpt::find_checkpoint(root); });
  EXPECT_TRUE(contains(e, sidecar + ": checksum mismatch")) << e;
  fs::remove_all(root);
}

TEST(CheckpointMetadata, MissingMarkerRefusesAndCkptStepChooses) {
  const std::string root = run_with_checkpoints("nomarker");
  fs::remove(root + "/" + ckpt::kLatestFile);
  const auto before = digest(root);
  testing::NullOut null;
  // --load D --save D used to start from scratch here and then overwrite the iteration directories.
  std::string e = error_of([&] {
    train::Trainer(testing::ckpt_config({"--load", root, "--save", root}), null.f, false).run();
  });
  EXPECT_TRUE(contains(e, "--load " + root +
                              " has no latest_checkpointed_iteration.txt but holds complete "
                              "checkpoints: iter_0000002, iter_0000004; choose one with --ckpt-step N (e.g. "
                              "--ckpt-step 4 for the newest)"))
      << e;
  EXPECT_EQ(digest(root), before);
  e = error_of([&] { train::Trainer(testing::ckpt_config({"--load", root, "--ckpt-step", "3"}), null.f, false); });
  EXPECT_TRUE(contains(e, "--ckpt-step 3: " + ckpt::iteration_dir(root, 3) + " is not there")) << e;
  e = error_of([&] { train::Trainer(testing::ckpt_config({"--ckpt-step", "3"}), null.f, false); });
  EXPECT_TRUE(contains(e, "--ckpt-step 3 needs --load")) << e;
  // Resuming iteration 2 into the same root would overwrite iteration 4, which it did not load.
  e = error_of([&] {
    train::Trainer(testing::ckpt_config({"--load", root, "--ckpt-step", "2", "--save", root}), null.f, false);
  });
  EXPECT_TRUE(contains(e, "--save " + root +
                              " holds complete checkpoints at or after iteration 2 that this run did "
                              "not load (iter_0000004)"))
      << e;
  EXPECT_EQ(digest(root), before);
  // Iteration 4 chosen: training continues from it and saves on.
  train::Trainer t(testing::ckpt_config({"--load", root, "--ckpt-step", "4", "--save", root}), null.f, false);
  EXPECT_EQ(t.iteration(), 4);
  EXPECT_EQ(t.loaded_from(), ckpt::iteration_dir(root, 4));
  t.run();
  EXPECT_EQ(read_file(root + "/" + ckpt::kLatestFile, "test"), "8");
  const auto after = digest(root);
  for (const auto& [file, sum] : before) {
    if (file != ckpt::kMarkerSidecar) {
      EXPECT_EQ(after.at(file), sum) << file;
    }
  }
  fs::remove_all(root);
}

TEST(CheckpointMetadata, SaveNeverReplacesCheckpointsItDidNotLoad) {
  const std::string root = run_with_checkpoints("fresh");
  const auto before = digest(root);
  testing::NullOut null;
  std::string e = error_of([&] { train::Trainer(testing::ckpt_config({"--save", root}), null.f, false); });
  EXPECT_TRUE(contains(e, "--save " + root +
                              " already holds complete checkpoints (iter_0000002, iter_0000004) and "
                              "this run loads none of them"))
      << e;
  EXPECT_TRUE(contains(e, "Pass --load " + root + " to resume")) << e;
  // Loaded from elsewhere at iteration 2, saving into a root that holds iteration 4.
  const std::string other = testing::own_temp_path("meta_other");
  testing::make_checkpoints(other, {2});
  e = error_of([&] { train::Trainer(testing::ckpt_config({"--load", other, "--save", root}), null.f, false); });
  EXPECT_TRUE(contains(e, "at or after iteration 2 that this run did not load (iter_0000002, iter_0000004)")) << e;
  // --finetune restarts at iteration 0: even the loaded checkpoint would be replaced.
  e = error_of([&] {
    train::Trainer(testing::ckpt_config({"--load", root, "--finetune", "--save", root}), null.f, false);
  });
  EXPECT_TRUE(contains(e, "at or after iteration 0 that this run did not load (iter_0000002, iter_0000004)")) << e;
  EXPECT_EQ(digest(root), before);
  // Resuming the newest into its own root is the normal case.
  train::Trainer t(testing::ckpt_config({"--load", root, "--save", root}), null.f, false);
  EXPECT_EQ(t.iteration(), 4);
  fs::remove_all(root);
  fs::remove_all(other);
}

TEST(CheckpointMetadata, TmpAndIncompleteDirectoriesAreRefusedByName) {
  const std::string root = run_with_checkpoints("partial");
  const std::string tmp = ckpt::iteration_dir(root, 6) + ".tmp", half = ckpt::iteration_dir(root, 8);
  fs::copy(ckpt::iteration_dir(root, 4), tmp, fs::copy_options::recursive);
  fs::copy(ckpt::iteration_dir(root, 4), half, fs::copy_options::recursive);
  fs::remove(half + "/index.json");
  const auto before = digest(root);
  testing::NullOut null;
  for (const std::string& load : {tmp, tmp + "/"}) {
    const std::string e = error_of([&] { train::Trainer(testing::ckpt_config({"--load", load}), null.f, false); });
    EXPECT_TRUE(contains(e, "--load " + tmp + " is the temporary directory of a checkpoint save that did not finish"))
        << e;
    EXPECT_TRUE(contains(e, "(complete there: iter_0000002, iter_0000004)")) << e;
  }
  std::string e = error_of([&] { train::Trainer(testing::ckpt_config({"--load", half}), null.f, false); });
  EXPECT_TRUE(contains(e, "--load " + half + " is an incomplete checkpoint (no index.json")) << e;
  e = error_of([&] { ckpt::find_checkpoint(root, 8); });
  EXPECT_TRUE(contains(e, "--ckpt-step 8: " + half + " is incomplete")) << e;
  EXPECT_EQ(digest(root), before);
  fs::remove_all(root);
}

// A root as a kill in the commit window of the iteration-4 save leaves it: iter_0000002 and iter_0000004 complete,
// the marker and its sidecar as the commit of iteration 2 wrote them.
std::string killed_before_commit(const std::string& name) {
  const std::string root = testing::own_temp_path("uncommitted_" + name), keep = root + ".marker";
  testing::NullOut null;
  train::Trainer t(testing::ckpt_config({"--save", root}), null.f, false);
  while (t.iteration() < 2) t.train_step();
  t.save_checkpoint();
  fs::remove_all(keep);
  fs::create_directories(keep);
  for (const char* f : {ckpt::kLatestFile, ckpt::kMarkerSidecar}) fs::copy(root + "/" + f, keep + "/" + f);
  while (t.iteration() < 4) t.train_step();
  t.save_checkpoint();
  for (const char* f : {ckpt::kLatestFile, ckpt::kMarkerSidecar})
    fs::copy(keep + "/" + f, root + "/" + f, fs::copy_options::overwrite_existing);
  fs::remove_all(keep);
  return root;
}

std::string text_of(std::FILE* f) {  // what a Trainer wrote to the temporary file `f`
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  return s;
}

TEST(UncommittedSaves, AKillBeforeTheMarkerMovesIsSetAsideAndTrainingGoesOnFromTheMarker) {
  const std::string root = killed_before_commit("resume");
  const std::string it2 = ckpt::iteration_dir(root, 2), it4 = ckpt::iteration_dir(root, 4);
  // Found only when the run trains on from the marker's checkpoint.
  const auto found = ckpt::uncommitted_saves(root, 2, it2);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, 4);
  EXPECT_EQ(found[0].second, it4);
  EXPECT_TRUE(ckpt::uncommitted_saves(root, 0, it2).empty());  // --finetune restarts: refused instead
  EXPECT_TRUE(ckpt::uncommitted_saves(root, 4, it4).empty());  // --ckpt-step 4 trains on from iteration 4
  EXPECT_TRUE(ckpt::uncommitted_saves(root, 2, "").empty());   // loaded from elsewhere
  const auto saved4 = digest(it4);

  std::FILE* out = std::tmpfile();
  train::Trainer t(testing::ckpt_config({"--load", root, "--save", root, "--save-interval", "2"}), out, false);
  EXPECT_EQ(t.iteration(), 2);
  EXPECT_EQ(t.loaded_from(), it2);
  const std::string aside = it4 + ".uncommitted-1";
  ASSERT_TRUE(fs::is_directory(aside));
  EXPECT_FALSE(fs::exists(it4));
  EXPECT_EQ(digest(aside), saved4);  // set aside whole, not deleted
  const std::string log = text_of(out);
  EXPECT_TRUE(contains(log, "note: set aside " + it4 +
                                " as iter_0000004.uncommitted-1: its save was never committed "
                                "(latest_checkpointed_iteration.txt names iteration 2"))
      << log;
  t.run();
  std::fclose(out);
  EXPECT_EQ(read_file(root + "/" + ckpt::kLatestFile, "test"), "8");
  EXPECT_TRUE(fs::exists(it4 + "/index.json"));  // saved again by this run
  EXPECT_EQ(digest(aside), saved4);
  // Not a checkpoint any more: the next resume sees nothing uncommitted.
  EXPECT_TRUE(ckpt::uncommitted_saves(root, 8, ckpt::iteration_dir(root, 8)).empty());
  fs::remove_all(root);
}

TEST(UncommittedSaves, SettingAsideNeverReplacesAnything) {
  const std::string root = killed_before_commit("noreplace");
  const std::string it4 = ckpt::iteration_dir(root, 4);
  fs::create_directories(it4 + ".uncommitted-1");  // an empty directory: a plain rename(2) would replace it
  const auto lines = ckpt::set_aside_uncommitted_saves(root, 2, ckpt::iteration_dir(root, 2), nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "as iter_0000004.uncommitted-2")) << lines[0];
  EXPECT_TRUE(fs::is_empty(it4 + ".uncommitted-1"));
  EXPECT_TRUE(fs::exists(it4 + ".uncommitted-2/index.json"));
  EXPECT_TRUE(ckpt::set_aside_uncommitted_saves(root, 2, ckpt::iteration_dir(root, 2), nullptr).empty());
  fs::remove_all(root);
}

TEST(UncommittedSaves, DirectoriesTheMarkerMayHaveNamedStayProtected) {
  const std::string root = killed_before_commit("protected");
  const std::string it2 = ckpt::iteration_dir(root, 2), marker = root + "/" + ckpt::kLatestFile;
  const std::string sidecar = root + "/" + ckpt::kMarkerSidecar;
  testing::NullOut null;
  // A marker moved back by hand: the sidecar records that moecore last wrote 4.
  write_file_atomic(sidecar, ckpt::metadata_text({{"format", ckpt::kMarkerFormat}, {"marker", "4"}}));
  auto before = digest(root);
  EXPECT_TRUE(ckpt::uncommitted_saves(root, 2, it2).empty());
  std::string e = error_of([&] {
    train::Trainer(testing::ckpt_config({"--load", root, "--save", root}), null.f, false);
  });
  EXPECT_TRUE(contains(e, marker + " says '2' but " + sidecar + " records that moecore last wrote '4'")) << e;
  EXPECT_EQ(digest(root), before);
  // No sidecar (an older format): nothing says which marker moecore wrote, so iteration 4 is not touched.
  fs::remove(sidecar);
  before = digest(root);
  EXPECT_TRUE(ckpt::uncommitted_saves(root, 2, it2).empty());
  e = error_of([&] { train::Trainer(testing::ckpt_config({"--load", root, "--save", root}), null.f, false); });
  EXPECT_TRUE(contains(e,
                       "holds complete checkpoints at or after iteration 2 that this run did not load "
                       "(iter_0000004)"))
      << e;
  EXPECT_EQ(digest(root), before);
  // --finetune from the marker's checkpoint would replace both: refused before anything is set aside.
  write_file_atomic(sidecar, ckpt::metadata_text({{"format", ckpt::kMarkerFormat}, {"marker", "2"}}));
  before = digest(root);
  e = error_of([&] {
    train::Trainer(testing::ckpt_config({"--load", root, "--finetune", "--save", root}), null.f, false);
  });
  EXPECT_TRUE(contains(e, "at or after iteration 0 that this run did not load (iter_0000002, iter_0000004)")) << e;
  EXPECT_EQ(digest(root), before);
  fs::remove_all(root);
}

TEST(CheckpointMetadata, SaveDirectoryIsCheckedWritableWithRoom) {
  const std::string d = testing::own_temp_path("meta_space");
  fs::create_directories(d);
  std::ofstream(d + "/file") << "x";
  // Not creatable (a regular file in the way; permissions would not stop root): refused before the first step.
  testing::NullOut null;
  std::string e = error_of([&] { train::Trainer(testing::ckpt_config({"--save", d + "/file/ck"}), null.f, false); });
  EXPECT_TRUE(contains(e, "--save " + d + "/file/ck: cannot create the directory")) << e;
  // Room: the bytes needed and available are named; the probe leaves nothing behind.
  const int64_t huge = int64_t{1} << 62;
  e = error_of([&] { ckpt::check_save_directory(d + "/ck", huge, 0); });
  EXPECT_TRUE(contains(e, "--save " + d + "/ck: a checkpoint of this model needs 4611686018427387904 bytes")) << e;
  EXPECT_TRUE(contains(e, "bytes (")) << e;
  EXPECT_TRUE(contains(e, "available")) << e;
  ckpt::check_save_directory(d + "/ck", 1, 0);
  EXPECT_TRUE(fs::is_empty(d + "/ck"));
  fs::remove_all(d);
}

}  // namespace
}  // namespace moecore
