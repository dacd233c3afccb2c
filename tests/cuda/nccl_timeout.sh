#!/usr/bin/env bash
# The NCCL watchdog under mpirun with one GPU per rank (two ranks on two GPUs; skipped, exit 0, with fewer): rank 1
# sleeps five minutes before step 2 (--testing-stall 1:2:300) with a 3-second collective timeout. Rank 0's NCCL
# operations never complete and its host may block in a CUDA call that waits on them, which the MPI watchdog cannot
# see: the NCCL watchdog thread must end the job well before the stall ends, with a non-zero status and one report
# naming the operation, its group and its ranks.
# Usage: nccl_timeout.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/../ckpt/script_setup.sh"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
if [[ ${ngpu:-0} -lt 2 ]]; then
  echo "SKIP: nccl timeout needs two GPUs (one per rank); ${ngpu:-0} visible"
  exit 0
fi
A=(--device cuda --mock-data --vocab-size 64 --num-layers 1 --hidden-size 32 --num-attention-heads 2
  --disable-bias-linear --num-experts 4 --seq-length 16 --eval-iters 0 --micro-batch-size 1 --global-batch-size 8
  --train-iters 4 --log-interval 1 --expert-model-parallel-size 2 --hidden-dropout 0 --attention-dropout 0)
start=$(date +%s)
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --testing-collective-timeout-seconds 3 --testing-stall 1:2:300 \
  >"$D/out.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
grep "NCCL between GPUs" "$D/out.log" || fail "the job did not run on NCCL: $(grep 'rank.* on this node' "$D/out.log")"
grep -A4 "longer than --testing-collective-timeout-seconds 3 allows" "$D/out.log"
[ $rc -ne 0 ] || fail "the job exited 0 with a stalled rank"
[ $took -lt 150 ] || fail "the job took $took s to end (the stall is 300 s): the timeout did not end it"
grep -Eq "moecore: (a send|a receive|all-reduce|all-gather|all-to-all|reduce-scatter|broadcast|barrier) on the [a-z() -]+ group.* on rank 0 (has not completed after|has waited)" \
  "$D/out.log" || fail "no report names the operation and its group on rank 0: $(grep -A3 'moecore:' "$D/out.log" | head)"
grep -Eq "^  ranks of that (operation|group)[a-z ]*: .*1" "$D/out.log" ||
  fail "the report does not name rank 1: $(grep -A4 'longer than' "$D/out.log")"
echo "nccl timeout: the job ended in $took s naming the operation and rank 1"
