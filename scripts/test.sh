#!/usr/bin/env bash
# The whole test suite from a fresh clone, in two stages, each timed:
#   1. install dependencies, configure and build (g++, Release), CTest without the sanitizer tests;
#   2. the sanitized stage: clang-14 ASan+UBSan build of the library, fuzz targets and unit tests
#      (tests/fuzz/CMakeLists.txt; CTest sanitized_build), then the unit and multi-rank tests against it and every
#      fuzz target for a short run on its seed corpus (sanitized_unit_tests, sanitized_mpi_tests, fuzz_all_targets;
#      a finding fails the run).
# Budget: under 15 minutes on the 2-core build machine (docs/reliability.md has the measured times).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
times=()
tests_s=0  # the stages that run tests (the budget of 15 minutes on 2 cores): installation and compiles apart
stage() {  # stage NAME COMMAND...: runs it, records its seconds
  local name="$1" t0
  shift
  t0=$(date +%s)
  echo "=== test.sh: $name"
  "$@"
  times+=("$name: $(($(date +%s) - t0)) s")
  case "$name" in stage*) tests_s=$((tests_s + $(date +%s) - t0)) ;; esac
  echo "=== test.sh: $name took $(($(date +%s) - t0)) s"
}
# Stage 1 runs the unit tests (gtest cases, each single-threaded: OMP_NUM_THREADS=1 in CMakeLists.txt) one per core;
# every scripted test (multi-rank, signals, timing, benchmarks) has RUN_SERIAL and runs alone, but for those of one
# process on one thread and nothing timed (MOECORE_ONE_CORE_TESTS in CMakeLists.txt), which run beside the unit tests.
sanitized='^(sanitized_|fuzz_)'
stage "install dependencies" bash scripts/install-deps.sh
stage "configure and build" bash -c 'cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOECORE_BUILD_TESTS=ON &&
  cmake --build build -j"$(nproc)"'
stage "stage 1: tests" ctest --test-dir build --output-on-failure -j"$(nproc)" -E "$sanitized"
stage "sanitized build" ctest --test-dir build --output-on-failure -R '^sanitized_build$'
# (CTest re-runs the sanitized_build fixture first: an up-to-date build, a few seconds.)
stage "stage 2: sanitized unit tests and fuzzing" ctest --test-dir build --output-on-failure -R "$sanitized" \
  -E '^sanitized_build$'
echo "=== test.sh: times"
for t in "${times[@]}"; do echo "  $t"; done
echo "  tests (stage 1 + stage 2): $tests_s s"
echo "  total: $(($(date +%s) - start)) s"
