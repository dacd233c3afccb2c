# How the test binaries compile (the main build's moecore_tests / moecore_mpi_tests and the sanitized build's).
# Test files are unity-built in batches of 8 like the library (MOECORE_UNITY_BUILD): helpers in a test file's
# anonymous namespace share one namespace with the other files of its batch, so their names must be unique across
# the test tree (shared helpers live in tests/test_util.h, config_util.h, mpi/layout_util.h; file-specific ones
# carry the file's subject in their name: resume_config, hf_dir, SchedulingLayout). The heavy headers every test
# file includes are precompiled once per target, and the test code itself is compiled at -O1 (the library it calls
# keeps its own optimisation): two-thirds of a test file's compile time was GCC optimising gtest's macro expansions
# at -O3.
function(moecore_test_build_options target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${MOECORE_UNITY_BUILD} UNITY_BUILD_BATCH_SIZE 8)
  target_compile_options(${target} PRIVATE -O1)
  target_precompile_headers(${target} PRIVATE <gtest/gtest.h> <nlohmann/json.hpp> <fmt/format.h> <algorithm>
                            <cmath> <filesystem> <functional> <memory> <string> <vector>)
endfunction()
