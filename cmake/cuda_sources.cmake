# Which sources a build compiles, by name: kernels/cuda/*.cpp, device/*_cuda.cpp and *.cu only with the CUDA backend,
# comm/nccl_comm.cpp only with CUDA and NCCL; *_unavailable.cpp (the stand-ins, each beside what it stands in for:
# device/runtime_unavailable.cpp for the runtime, kernels/cuda/attention_cudnn_unavailable.cpp for cuDNN's loader,
# comm/nccl_comm_unavailable.cpp for NCCL) only without them. moecore_add_cuda adds back what a build has.
function(moecore_filter_cuda_sources list_var)
  set(sources ${${list_var}})
  list(FILTER sources EXCLUDE REGEX "src/moecore/kernels/cuda/|src/moecore/device/[a-z_]*_cuda\\.cpp$|src/moecore/comm/nccl_comm\\.cpp$|_unavailable\\.cpp$")
  set(${list_var} ${sources} PARENT_SCOPE)
endfunction()
