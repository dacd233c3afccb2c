// The CUDA backend of the router's ops (kernels/router.h, where each op is specified) at the Tensor level, over the
// launchers of launch_router.h: f32 tensors, I32 ids, f64 counts and sums, all on one GPU. Plain host declarations
// (no CUDA headers); a CPU-only build defines them in router_ops_unavailable.cpp, where they throw (no CUDA tensor
// can exist there). kernels/router.cpp calls these for GPU tensors.
#pragma once

#include "moecore/kernels/router.h"

namespace moecore::kernels::cuda {

// f64 router dtype and Sinkhorn selection: refused with the flag's name (the GPU router computes in f32 and has no
// Sinkhorn).
void router_check_backend(DType router_dtype);
#include "moecore/kernels/router_backend.inc"

}  // namespace moecore::kernels::cuda
