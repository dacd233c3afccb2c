# Which sources a build compiles, by name: kernels/cuda/*.cpp, device/*_cuda.cpp and *.cu only with the CUDA backend;
# *_unavailable.cpp (the CPU-only build's stand-ins, each beside what it stands in for: device/runtime_unavailable.cpp
# for the runtime, kernels/cuda/*_unavailable.cpp for the kernel families) only without it.
function(moecore_filter_cuda_sources list_var)
  set(sources ${${list_var}})
  list(FILTER sources EXCLUDE REGEX "src/moecore/kernels/cuda/|src/moecore/device/[a-z_]*_cuda\\.cpp$|_unavailable\\.cpp$")
  set(${list_var} ${sources} PARENT_SCOPE)
endfunction()
