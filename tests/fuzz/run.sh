#!/usr/bin/env bash
# The sanitized build and what runs in it (stage 2 of scripts/test.sh; CTest tests sanitized_build,
# sanitized_unit_tests and fuzz_all_targets). Usage:
#   run.sh build WORK            configure and build tests/fuzz/CMakeLists.txt with clang-14 into WORK
#   run.sh unit WORK [FILTER]    the unit tests built against the ASan+UBSan library (a gtest filter)
#   run.sh mpi WORK [FILTER]     the multi-rank tests against it, under mpirun on 2 ranks
#   run.sh fuzz WORK [SECONDS]   every libFuzzer target for SECONDS (default 10) from tests/fuzz/corpus/<target>/,
#                                one per core at a time
# A finding (crash, sanitizer report, timeout, out-of-memory) fails the run and leaves the input in
# WORK/artifacts/; add it to the target's corpus as a regression case once fixed.
set -euo pipefail
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"  # where, not only what
here="$(cd "$(dirname "$0")" && pwd)"
mode="$1"
work="$2"
mkdir -p "$work"
case "$mode" in
build)
  cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
  # The log keeps clang's warnings (OpenMP simd hints it cannot honour at -O1) out of the test output.
  cmake --build "$work/build" -j"$(nproc)" >"$work/build.log" 2>&1 || {
    grep -B2 -A8 "error" "$work/build.log" | head -80
    echo "sanitized build: FAILED (log: $work/build.log)"
    exit 1
  }
  test -x "$work/build/moecore_san_tests"
  test -x "$work/build/moecore_san_mpi_tests"
  for t in "$here"/corpus/*/; do test -x "$work/build/$(basename "$t")"; done
  echo "sanitized build: done"
  ;;
unit)
  # LeakSanitizer stays on: a leak fails the run like any other report. An allocation too large to serve returns
  # null, as malloc does, so the allocator's own out-of-memory message is what the tests see.
  # One gtest shard per core, each single-threaded: the sanitized tests are compute-bound and mostly too small for
  # OpenMP to pay (two OpenMP teams per core spin against each other), so the shards finish in about 1/nproc the time.
  shards="$(nproc)"
  pids=()
  for i in $(seq 0 $((shards - 1))); do
    GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$i" OMP_NUM_THREADS=1 \
      ASAN_OPTIONS="allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
      "$work/build/moecore_san_tests" --gtest_filter="${3:-*}" --gtest_brief=1 >"$work/unit_shard_$i.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      tail -n 2 "$work/unit_shard_$i.log"
    else
      cat "$work/unit_shard_$i.log"
      echo "sanitized unit tests: shard $((i + 1)) of $shards FAILED (log $work/unit_shard_$i.log)"
      rc=1
    fi
  done
  exit "$rc"
  ;;
mpi)
  # LeakSanitizer is off here: Open MPI keeps its allocations until the process ends, by design.
  ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    mpirun --allow-run-as-root --oversubscribe -np 2 -x ASAN_OPTIONS -x UBSAN_OPTIONS -x OMP_NUM_THREADS=1 \
    "$work/build/moecore_san_mpi_tests" --gtest_filter="${3:-*}" --gtest_brief=1
  ;;
fuzz)
  # One target per core at a time (each libFuzzer run is one process on one thread), every target for SECONDS.
  seconds="${3:-10}"
  fuzz_one() {  # TARGET DIR: runs it, its report in $work/$t.report; fails on a finding
    local t="$1" dir="$2" out="$work/corpus/$1" rc=0  # what the run finds goes to $out, not into the source tree
    rm -rf "$out" && mkdir -p "$out" "$work/artifacts"
    echo "fuzzing $t for ${seconds} s from $(ls "$dir" | wc -l) seeds" >"$work/$t.report"
    "$work/build/$t" -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/$t-" "$out" "$dir" >"$work/$t.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
      grep -E "ERROR|SUMMARY|terminate|what\(\)|^    #[0-9] |#1[0-9] .*moecore|Test unit written" "$work/$t.log" |
        head -40 >>"$work/$t.report" || true
      echo "fuzz: FINDING in $t (log $work/$t.log, input in $work/artifacts/)" >>"$work/$t.report"
    fi
    { grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$t.log" || true; } |
      tr '\n' ' ' >>"$work/$t.report"
    echo >>"$work/$t.report"
    return "$rc"
  }
  targets=()
  for dir in "$here"/corpus/*/; do targets+=("$(basename "$dir")"); done
  pids=()
  for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
    fuzz_one "$t" "$here/corpus/$t/" &
    pids+=($!)
  done
  failed=""
  for i in "${!targets[@]}"; do  # every target's status, a finding or the runner's own failure alike
    wait "${pids[$i]}" || failed="$failed ${targets[$i]}"
    cat "$work/${targets[$i]}.report" 2>/dev/null || true
  done
  if [ -n "$failed" ]; then
    echo "fuzz: findings in$failed"
    exit 1
  fi
  echo "fuzz: all ${#targets[@]} targets ran ${seconds} s each, $(nproc) at a time, without a finding"
  ;;
*)
  echo "usage: run.sh build|unit|mpi|fuzz WORK [ARG]" >&2
  exit 2
  ;;
esac
