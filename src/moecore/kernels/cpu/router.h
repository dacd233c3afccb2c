// The CPU backend of the router's ops (kernels/router.h, where each op is specified): f32 or f64, the router dtype.
// kernels/router.cpp calls these for CPU tensors.
#pragma once

#include "moecore/kernels/router.h"

namespace moecore::kernels::cpu {

#include "moecore/kernels/router_backend.inc"

}  // namespace moecore::kernels::cpu
