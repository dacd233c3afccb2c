// The kernel backends' tables of ops, one per op family and device (the op's header, kernels/*.h, defines the table's
// type): the CPU's always, the GPU's in a build with CUDA. Only kernels/dispatch.cpp reads them, choosing by where an
// op's tensors live; a build without CUDA declares no GPU table, and dispatch.cpp answers a GPU tensor there (which
// no correct caller has) with the build's message, for every op at once.
#pragma once

#include "moecore/kernels/attention.h"
#include "moecore/kernels/routing.h"

namespace moecore::kernels {

namespace cpu {
extern const RouterKernels kRouterKernels;        // kernels/cpu/routing.cpp
extern const AttentionKernels kAttentionKernels;  // kernels/cpu/attention.cpp
}  // namespace cpu

namespace cuda {
extern const RouterKernels kRouterKernels;        // kernels/cuda/routing.cpp
extern const AttentionKernels kAttentionKernels;  // kernels/cuda/attention.cpp
}  // namespace cuda

}  // namespace moecore::kernels
