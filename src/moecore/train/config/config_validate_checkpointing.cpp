// validate()'s checkpoint and run-control checks (see config_validate.h): the flags that apply to --load, upcycling's
// inputs, --save-retain-interval, the stop signal, and the forms of the testing faults. Not the checkpoint files
// (ckpt/manager.h, at start) nor the upcycled experts' sizes (config_validate_moe.cpp).
#include <utility>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/signals.h"

namespace moecore::train {

namespace {

// --fault-kill-during-save RANK:ITERATION and --testing-stall RANK:ITERATION:SECONDS: integers where their form says.
void check_testing_faults(const TrainConfig& c) {
  if (!c.fault_kill_during_save.empty()) {
    const auto colon = c.fault_kill_during_save.find(':');
    MOE_CHECK(colon != std::string::npos, "--fault-kill-during-save expects RANK:ITERATION, got '{}'",
              c.fault_kill_during_save);
    to_int("fault-kill-during-save", c.fault_kill_during_save.substr(0, colon));
    to_int("fault-kill-during-save", c.fault_kill_during_save.substr(colon + 1));
  }
  if (!c.testing_stall.empty()) {
    const auto a = c.testing_stall.find(':'), b = c.testing_stall.rfind(':');
    MOE_CHECK(a != std::string::npos && b != a, "--testing-stall expects RANK:ITERATION:SECONDS, got '{}'",
              c.testing_stall);
    to_int("testing-stall", c.testing_stall.substr(0, a));
    to_int("testing-stall", c.testing_stall.substr(a + 1, b - a - 1));
    to_int("testing-stall", c.testing_stall.substr(b + 1));
  }
}

}  // namespace

void validate_checkpointing(const TrainConfig& c) {
  MOE_CHECK(StopSignals::parse(c.exit_signal) != 0,
            "--exit-signal {} is not a signal a handler can catch and return from; one of: {}", c.exit_signal,
            StopSignals::kExitSignalChoices);
  // --save-interval without --save saves nothing, as in Megatron (training.py saves when both are set).
  for (auto [on, name] : {std::pair{c.finetune, "finetune"},
                          {c.no_load_optim, "no-load-optim"},
                          {c.no_load_rng, "no-load-rng"},
                          {c.moe_use_upcycling, "moe-use-upcycling"}})
    MOE_CHECK(!on || !c.load.empty(), "--{} needs --load (the checkpoint it applies to)", name);
  MOE_CHECK(c.ckpt_step < 0 || !c.load.empty(), "--ckpt-step {} needs --load (the directory holding iter_NNNNNNN)",
            c.ckpt_step);
  MOE_CHECK(c.moe_upcycling_granularity == 1 || c.moe_use_upcycling,
            "--moe-upcycling-granularity {} without --moe-use-upcycling", c.moe_upcycling_granularity);
  if (c.moe_use_upcycling) {
    MOE_CHECK(c.num_experts > 0, "--moe-use-upcycling needs --num-experts (the MoE model to make)");
    MOE_CHECK(!c.save.empty(), "--moe-use-upcycling needs --save (where the upcycled checkpoint goes)");
    MOE_CHECK(c.load_hf.empty(), "--moe-use-upcycling upcycles a native dense checkpoint (--load), not --load-hf");
  }
  // Run control: Megatron's check on --save-retain-interval.
  if (c.save_retain_interval > 0 && c.save_interval > 0)
    MOE_CHECK(c.save_retain_interval % c.save_interval == 0,
              "--save-retain-interval {} must be a multiple of --save-interval {} (as Megatron requires)",
              c.save_retain_interval, c.save_interval);
  // Megatron's CheckpointingConfig: the integrity manifest belongs to torch_dist, its default format ("moecore" here).
  MOE_CHECK(!c.verify_integrity || c.ckpt_format == "torch_dist" || c.ckpt_format == "moecore",
            "`verify_integrity` is only supported with torch_dist checkpoint format (Megatron's rule), not "
            "--ckpt-format {}: drop --verify-integrity or use --ckpt-format torch_dist",
            c.ckpt_format);
  check_testing_faults(c);
}

}  // namespace moecore::train
