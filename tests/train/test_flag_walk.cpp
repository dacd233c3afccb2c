// Every flag of the table walked with boundary and nonsense values over a tiny valid run: each either is accepted
// (and then a Trainer builds and takes one step) or is refused with moecore::Error naming the flag; never an
// internal assertion, another exception type or a crash. Also: ranges show in --help, the memory plan refuses a
// run that cannot fit, and an absurd allocation is an Error with the numbers.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <filesystem>

#include "config_util.h"
#include "moecore/core/allocator.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/rank_agreement.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> walk_tiny_run() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 1, "1e-3");
}

// Runs from a scratch directory, so path-like values ("abc", "0") land there.
struct InScratchDir {
  std::filesystem::path old = std::filesystem::current_path();
  explicit InScratchDir(const std::string& name) {
    const std::string dir = testing::fresh_temp_path(name);
    std::filesystem::create_directories(dir);
    std::filesystem::current_path(dir);
  }
  ~InScratchDir() { std::filesystem::current_path(old); }
};

TEST(TrainConfigWalk, EveryFlagAcceptsOrNamesItselfAndNothingAssertsLater) {
  InScratchDir scratch("flag_walk");
  const std::vector<std::string> values = {
      "0", "-1", "1e30", "9223372036854775807", "-9223372036854775808", "nan", "inf", "", "abc", "1"};
  // ~840 tiny cases: one thread each keeps the walk within seconds on a shared machine.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::FILE* null = std::fopen("/dev/null", "w");
  int parsed = 0, accepted = 0, stepped = 0;
  std::vector<std::string> failures;
  for (const auto& f : train::flag_table()) {
    const bool is_bool = std::holds_alternative<bool train::TrainConfig::*>(f.field);
    std::vector<std::vector<std::string>> cases;
    if (is_bool) {
      cases = {{"--" + f.name}, {"--" + f.name + "=abc"}, {"--" + f.name + "=false"}};
    } else {
      for (const auto& v : values) cases.push_back({"--" + f.name, v});
    }
    for (const auto& extra : cases) {
      const std::string what = fmt::format("{} {}", extra[0], extra.size() > 1 ? "'" + extra[1] + "'" : "");
      parsed++;
      std::optional<train::TrainConfig> c;
      try {
        c = testing::small_config(walk_tiny_run(), extra);
      } catch (const Error& e) {
        const std::string m = e.what();
        if (m.find(f.name) == std::string::npos) failures.push_back(what + ": the error names another flag: " + m);
        continue;
      } catch (const std::exception& e) {
        failures.push_back(what + ": parse threw a non-user error: " + e.what());
        continue;
      }
      accepted++;
      try {  // late checks: the Trainer's start-up (memory plan, model, data) and one step
        train::Trainer t(*c, null, false);
        if (!c->skip_train) {
          t.train_step();
          stepped++;
        }
      } catch (const Error&) {
        // refused at start-up (e.g. a plan that cannot fit): a message, which is what is promised
      } catch (const std::exception& e) {
        failures.push_back(what + ": accepted, then the Trainer threw a non-user error: " + e.what());
      }
    }
  }
  std::fclose(null);
  omp_set_num_threads(threads);
  std::string all;
  for (const auto& s : failures) all += s + "\n";
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << parsed << " cases:\n" << all;
  EXPECT_GT(accepted, 50);  // the walk reached the Trainer often enough to mean something
  EXPECT_GT(stepped, 30);
}

TEST(TrainConfigWalk, KnownHolesAreClosedWithTheAcceptedRange) {
  auto err = [](std::vector<std::string> extra) {
    return testing::error_of([&] { testing::small_config(walk_tiny_run(), extra); });
  };
  EXPECT_NE(err({"--num-experts", "-4"}).find("--num-experts -4 is out of range; accepted: >= 0"), std::string::npos);
  EXPECT_NE(err({"--moe-ffn-hidden-size", "-1"}).find("--moe-ffn-hidden-size -1 is out of range"), std::string::npos);
  EXPECT_NE(err({"--adam-beta1", "2"}).find("--adam-beta1 2 is out of range; accepted: in [0, 1)"), std::string::npos);
  EXPECT_NE(err({"--adam-beta2", "1"}).find("--adam-beta2 1 is out of range"), std::string::npos);
  EXPECT_NE(err({"--kv-channels", "-16"}).find("--kv-channels -16 is out of range; accepted: > 0"), std::string::npos);
  EXPECT_NE(err({"--lr", "nan"}).find("--lr nan is not a finite number"), std::string::npos);
  EXPECT_NE(err({"--moe-router-dtype", "fp16"}).find("--moe-router-dtype fp16 is not accepted; one of: fp32, fp64"),
            std::string::npos);
  EXPECT_NE(err({"--moe-aux-loss-coeff", "inf"}).find("--moe-aux-loss-coeff inf is out of range"), std::string::npos);
  // Megatron's own limits, not stricter: beta 0 and eps 0 are accepted as torch.optim.Adam accepts them.
  EXPECT_EQ(err({"--adam-beta1", "0", "--adam-eps", "0"}), "");
  std::string help;
  try {
    train::parse_flags({"--help"});
  } catch (const train::HelpRequested& h) {
    help = h.text;
  }
  EXPECT_NE(help.find("Adam beta1 [in [0, 1)]"), std::string::npos) << help;
  EXPECT_NE(help.find("Hidden size H [> 0]"), std::string::npos);
}

TEST(TrainMemory, ARunThatCannotFitIsRefusedWithThePlanAndAdvice) {
  const train::TrainConfig c = testing::small_config(walk_tiny_run(), {"--testing-memory-limit", "100000"});
  std::FILE* null = std::fopen("/dev/null", "w");
  const std::string e = testing::error_of([&] { train::Trainer t(c, null, false); });
  std::fclose(null);
  EXPECT_NE(e.find("the run cannot fit in memory"), std::string::npos) << e;
  EXPECT_NE(e.find("this rank may use 97.7 KiB (--testing-memory-limit)"), std::string::npos) << e;
  EXPECT_NE(e.find("--micro-batch-size"), std::string::npos) << e;
  EXPECT_NE(e.find("--use-distributed-optimizer"), std::string::npos) << e;
  // The plan: Adam moments divide over data parallelism under the distributed optimizer; activations and logits
  // scale with the micro-batch.
  train::PlanLayout four;  // four data-parallel ranks
  four.dp = four.edp = 4;
  const train::MemoryPlan full = train::plan_memory(c, 128, four, 0);
  train::TrainConfig d = c;
  d.use_distributed_optimizer = true;
  EXPECT_DOUBLE_EQ(train::plan_memory(d, 128, four, 0).adam, full.adam / 4);
  d.micro_batch_size = 2 * c.micro_batch_size;
  EXPECT_NEAR(train::plan_memory(d, 128, four, 0).logits, 2 * full.logits, 0.25 * full.logits);  // size classes
  EXPECT_DOUBLE_EQ(full.total(), full.weights + full.bf16_weights + full.grads + full.adam + full.master + full.comm +
                                     full.peak_activations + full.working);
  EXPECT_THROW(train::check_memory_fits(c, full, {full.total() / 2, "a test"}), Error);
  EXPECT_NO_THROW(train::check_memory_fits(c, full, {full.total(), "a test"}));
  const train::MemoryLimit here = train::detect_memory_limit(1), shared = train::detect_memory_limit(4);
  EXPECT_GT(here.bytes, 0);
  EXPECT_NEAR(shared.bytes * 4, here.bytes, here.bytes * 0.05);  // MemAvailable moves a little between reads
}

TEST(TrainMemory, ThePlanBeforeBuildingCountsTheParametersTheModelHolds) {
  const std::vector<std::string> run = testing::mock_run_flags(16, 2, 2, 64, 1, "1e-3");
  std::vector<std::string> biased_moe = testing::tiny_moe_flags();  // Megatron's default biases, experts' included
  biased_moe.erase(std::find(biased_moe.begin(), biased_moe.end(), "--disable-bias-linear"));
  for (const auto& model :
       {testing::tiny_moe_flags(), testing::layered_moe_flags(), biased_moe,
        std::vector<std::string>{"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                 "--untie-embeddings-and-output-weights"}}) {
    const train::TrainConfig c = testing::small_config(model + run);
    const int64_t padded = train::padded_vocab_size(c, c.vocab_size + 1);
    const train::ParallelGroups g(c, nullptr);
    nn::ParamRegistry reg;
    const auto built = train::build_model(c, padded, reg, g);
    double dense = 0, expert = 0;
    for (const auto& p : reg.all())
      (p->name.find(".experts.") != std::string::npos ? expert : dense) += static_cast<double>(p->value.numel());
    const train::ParamCounts planned = train::count_params(c, padded, 1, 1);
    EXPECT_EQ(planned.expert, expert) << model[1];
    EXPECT_NEAR(planned.dense, dense, 0.01 * dense) << model[1];
  }
}

TEST(TrainMemory, AnAbsurdAllocationIsAnErrorWithTheNumbers) {
  for (size_t bytes : {size_t(1) << 50, ~size_t(0)}) {
    const std::string e = testing::error_of([&] { Allocator::instance().allocate(bytes); });
    EXPECT_NE(e.find(fmt::format("out of host memory: could not allocate {} bytes", bytes)), std::string::npos) << e;
    EXPECT_NE(e.find("bytes in use"), std::string::npos) << e;
  }
}

TEST(TrainConfigWalk, RunIdentityNamesFlagsDataFilesAndTheCheckpoint) {
  train::TrainConfig c = testing::small_config(walk_tiny_run());
  c.data_path = {"0.3", "/nonexistent/corpus"};
  c.load = testing::fresh_temp_path("identity_load");
  const auto id = train::run_identity(c);
  auto value = [&](const std::string& k) {
    for (const auto& [what, v] : id)
      if (what == k) return v;
    return std::string("(absent)");
  };
  EXPECT_EQ(value("--lr"), "0.001");
  EXPECT_EQ(value("--num-experts"), "4");
  EXPECT_EQ(value("dataset file /nonexistent/corpus.bin"), "missing");
  EXPECT_EQ(value("dataset file 0.3.bin"), "(absent)");
  EXPECT_EQ(value("checkpoint in --load"), "none (start from scratch)");
}

}  // namespace
}  // namespace moecore
