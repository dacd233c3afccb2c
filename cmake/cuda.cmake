# The CUDA backend (docs/cuda.md). MOECORE_CUDA: AUTO (on when CMake's CheckLanguage finds nvcc), ON (required) or OFF.
# When on: the .cu kernels for sm_90a plus compute_90 PTX, cudart linked (cuBLASLt and cuDNN loaded at run time), the
# compile definition MOECORE_HAVE_CUDA, and the GPU test binary moecore_cuda_tests (CTest label gpu; every test skips
# with a one-line reason where no GPU is visible). When off: the *_unavailable.cpp stand-ins (the GPU runtime's, cuDNN's
# loader's, NCCL's) answer every device call with "this build has no CUDA", so the CPU-only build links the same
# interfaces; the kernel ops need none (kernels/dispatch.cpp has no GPU tables to pick and refuses a GPU tensor).
set(MOECORE_CUDA AUTO CACHE STRING "CUDA backend: AUTO (on when nvcc is found), ON or OFF")
set_property(CACHE MOECORE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(MOECORE_WITH_CUDA OFF)
if(NOT MOECORE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MOECORE_WITH_CUDA ON)
  elseif(MOECORE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOECORE_CUDA=ON but no CUDA compiler was found: put nvcc on PATH (e.g. /usr/local/cuda/bin) "
                        "or set CMAKE_CUDA_COMPILER, or configure with -DMOECORE_CUDA=OFF")
  endif()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/cuda_sources.cmake)  # moecore_filter_cuda_sources

function(moecore_add_cuda target)
  if(NOT MOECORE_WITH_CUDA)
    file(GLOB_RECURSE unavailable CONFIGURE_DEPENDS src/moecore/*_unavailable.cpp)
    target_sources(${target} PRIVATE ${unavailable})
    message(STATUS "moecore: CUDA backend off (MOECORE_CUDA=${MOECORE_CUDA})")
    return()
  endif()
  file(GLOB_RECURSE cu_sources CONFIGURE_DEPENDS src/moecore/*.cu)
  file(GLOB cuda_cpp CONFIGURE_DEPENDS src/moecore/device/*_cuda.cpp src/moecore/kernels/cuda/*.cpp)
  list(FILTER cuda_cpp EXCLUDE REGEX "_unavailable\\.cpp$")
  target_sources(${target} PRIVATE ${cu_sources} ${cuda_cpp})
  # nvcc parses only the small pointer-level headers (kernels/cuda/launch.h); unity batches are for the C++ side.
  set_source_files_properties(${cu_sources} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  target_compile_definitions(${target} PUBLIC MOECORE_HAVE_CUDA)
  # cuBLASLt is loaded at its first GEMM (kernels/cuda/cublaslt_loader.cpp): linked, its static initialisers cost
  # every process, CPU-only runs and each unit test, 0.1 s and 200 MiB at start. Its header is on cudart's path.
  target_link_libraries(${target} PUBLIC CUDA::cudart)
  # NCCL (docs/cuda.md "NCCL"): the toolkit folder's nccl.h and libnccl.so.2; without them the host-staged MPI path
  # only (comm/nccl_comm_unavailable.cpp).
  find_path(MOECORE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(MOECORE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(MOECORE_NCCL_INCLUDE_DIR AND MOECORE_NCCL_LIBRARY)
    target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/src/moecore/comm/nccl_comm.cpp)
    target_include_directories(${target} PRIVATE ${MOECORE_NCCL_INCLUDE_DIR})
    target_compile_definitions(${target} PUBLIC MOECORE_HAVE_NCCL)
    target_link_libraries(${target} PUBLIC ${MOECORE_NCCL_LIBRARY})
  else()
    target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/src/moecore/comm/nccl_comm_unavailable.cpp)
  endif()
  message(STATUS "moecore: NCCL ${MOECORE_NCCL_LIBRARY} (${MOECORE_NCCL_INCLUDE_DIR})")
  # cuDNN's fused attention (kernels/cuda/attention_cudnn*.cpp) needs only cuDNN 9's headers here: the library is
  # loaded with dlopen at run time, so the binaries start where libcudnn is absent (the attention then runs the
  # native kernels and says why). Without the headers the path is compiled out, and says that instead.
  find_path(MOECORE_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
  if(MOECORE_CUDNN_INCLUDE_DIR)
    target_include_directories(${target} PUBLIC ${MOECORE_CUDNN_INCLUDE_DIR})
    set(cudnn_status "cuDNN headers ${MOECORE_CUDNN_INCLUDE_DIR}, libcudnn loaded at run time")
  else()
    set(cudnn_status "no cuDNN headers: attention runs the native kernels only")
    message(WARNING "moecore: cudnn_graph.h not found; the GPU attention is built without cuDNN's fused attention")
  endif()
  target_link_libraries(${target} PUBLIC ${CMAKE_DL_LIBS})
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  message(STATUS "moecore: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                 "${CMAKE_CUDA_ARCHITECTURES}, ${cudnn_status})")
endfunction()

if(MOECORE_WITH_CUDA)
  # SASS for H100/H200 (sm_90a: wgmma, TMA) and compute_90 PTX for anything newer. Given as -gencode flags:
  # CMake before 3.28 does not know the "a" architectures in CMAKE_CUDA_ARCHITECTURES.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    string(APPEND CMAKE_CUDA_FLAGS " -gencode arch=compute_90a,code=sm_90a"
           " -gencode arch=compute_90,code=compute_90")
  endif()
  set(CMAKE_CUDA_STANDARD 17)  # the .cu files need C++17 only (CMake 3.25 knows no CUDA20 for nvcc 13)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_FLAGS_RELEASE "-O3 -DNDEBUG")
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
