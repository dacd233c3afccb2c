# How the test binaries compile (the main build's moecore_tests / moecore_mpi_tests and the sanitized build's).
# Test files are not unity-built: each defines its own helpers in an anonymous namespace, and a batch of them would
# collide. Instead the heavy headers every test file includes are precompiled once per target, and the test code
# itself is compiled at -O1 (the library it calls keeps its own optimisation): two-thirds of a test file's compile
# time was GCC optimising gtest's macro expansions at -O3.
function(moecore_test_build_options target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD OFF)
  target_compile_options(${target} PRIVATE -O1)
  target_precompile_headers(${target} PRIVATE <gtest/gtest.h> <nlohmann/json.hpp> <fmt/format.h> <algorithm>
                            <cmath> <filesystem> <functional> <memory> <string> <vector>)
endfunction()
