// A probe sees each module's output in forward and each module's input gradient in backward, named by the module's
// parameter prefix ("decoder.layers.3.self_attention"), in a fixed order that is the same on every rank. Unset (the
// default) it costs one branch per module. The trainer sets one to find where a step first went non-finite.
#pragma once

#include <functional>
#include <string>

#include "moecore/core/tensor.h"

namespace moecore::nn {

// `where`: the module; `backward`: false for its forward output, true for the gradient it passes down.
using Probe = std::function<void(const std::string& where, bool backward, const Tensor& t)>;

}  // namespace moecore::nn
