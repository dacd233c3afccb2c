// The merged pass of the combined 1F1B schedule (see combined_1f1b.h).
#include "moecore/train/pipeline/combined_1f1b.h"

#include <optional>

#include "moecore/core/error.h"
#include "moecore/core/fiber.h"
#include "moecore/nn/substeps.h"

namespace moecore::train {

namespace {

// The switch at sub-step boundaries: from the backward (this stack) into the forward's fiber, and from the fiber
// back. Once one side is done the other runs on alone.
class MergedPair : public nn::SubStepSwitch {
 public:
  MergedPair(int64_t f_mb, int64_t b_mb, const std::function<void()>& forward) : f_mb_(f_mb), b_mb_(b_mb) {
    if (forward) fiber_.emplace(forward);
  }
  void boundary() override {
    if (Fiber::current()) {
      Fiber::yield();
    } else if (fiber_ && !fiber_->done()) {
      fiber_->resume();
    }
  }
  void finish() {
    while (fiber_ && !fiber_->done()) fiber_->resume();
  }
  int64_t micro_batch() const override { return forward() ? f_mb_ : b_mb_; }
  bool forward() const override { return Fiber::current() != nullptr; }

 private:
  int64_t f_mb_, b_mb_;
  std::optional<Fiber> fiber_;
};

// Sets the switch for the pair's lifetime (cleared on the way out, an exception included).
struct SwitchScope {
  explicit SwitchScope(nn::SubStepSwitch* s) {
    MOE_ASSERT(nn::SubSteps::active() == nullptr);
    nn::SubSteps::set_switch(s);
  }
  ~SwitchScope() { nn::SubSteps::set_switch(nullptr); }
};

}  // namespace

void combined_forward_backward(int64_t f_mb, const std::function<void()>& forward, int64_t b_mb,
                               const std::function<void()>& backward) {
  MergedPair pair(f_mb, b_mb, forward);
  SwitchScope scope(&pair);
  if (backward) backward();
  pair.finish();
}

}  // namespace moecore::train
