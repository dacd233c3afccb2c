#!/usr/bin/env bash
# The collective watchdog (--distributed-timeout-minutes) under mpirun on 4 ranks (EP2, data-parallel 4): rank 2 sleeps five
# minutes before step 2 (--testing-stall 2:2:300) with a 3-second collective timeout. The job must end quickly
# (well before the stall ends) with a non-zero status, one report naming a collective by operation and group, and
# rank 2, exactly, as the rank in no collective.
# Usage: collective_timeout.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/../ckpt/script_setup.sh"
A=(--mock-data --vocab-size 64 --num-layers 1 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear
  --num-experts 4 --seq-length 16 --eval-iters 0 --micro-batch-size 1 --global-batch-size 8 --train-iters 4 --log-interval 1
  --expert-model-parallel-size 2)
start=$(date +%s)
"${mpirun[@]}" -np 4 "$moecore" train "${A[@]}" --testing-collective-timeout-seconds 3 --testing-stall 2:2:300 \
  >"$D/out.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
cat "$D/out.log" | grep -v "^ " | tail -n 3
grep -A6 "longer than --testing-collective-timeout-seconds 3 allows" "$D/out.log"
[ $rc -ne 0 ] || fail "the job exited 0 with a stalled rank"
[ $took -lt 150 ] || fail "the job took $took s to end (the stall is 300 s): the timeout did not end it"
[ "$(grep -c "longer than --testing-collective-timeout-seconds 3 allows" "$D/out.log")" = 1 ] ||
  fail "expected exactly one report: $(grep -c "longer than" "$D/out.log")"
grep -Eq "moecore: (all-reduce|all-gather|all-to-all|reduce-scatter|broadcast|barrier) on the [a-z() -]+ group \(collective #[0-9]+ of the [a-z-]+ group\) on rank [0-9]" \
  "$D/out.log" || fail "the report does not name the collective: $(grep -A4 'longer than' "$D/out.log")"
grep -Eq "^  ranks of that group that did not arrive: ([0-9, ]*)?2" "$D/out.log" ||
  fail "the report does not name rank 2 among the missing"
grep -Eq "^  ranks in no collective \(stalled, deadlocked in computation, or dead\): 2$" "$D/out.log" ||
  fail "the report does not name exactly rank 2 as stalled: $(grep 'in no collective' "$D/out.log")"
echo "collective timeout: the job ended in $took s naming rank 2"
