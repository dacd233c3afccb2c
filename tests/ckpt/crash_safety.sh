#!/usr/bin/env bash
# Crash safety of checkpoints, with real processes under mpirun (2 ranks, EP2, distributed optimizer):
#  1. rank 1 is SIGKILLed in the middle of the iteration-4 save (--fault-kill-during-save): the job fails, the
#     marker still names iteration 2, whose checkpoint loads; the resumed run (which clears the stale temporary
#     directory) reproduces the uninterrupted run's losses bitwise;
#  2. SIGTERM sent to one rank only: both ranks stop at the same step boundary, save, and exit 0;
#  3. SIGINT to a single process: it saves and exits 0;
#  4. a kill between the rename of iter_0000004 and the marker's update (the commit), left as such a kill leaves it
#     (the marker and its sidecar of iteration 2): `--load D --save D` sets iter_0000004 aside as
#     iter_0000004.uncommitted-1, says so, and trains on from iteration 2 bitwise as the uncommitted run did.
# Usage: crash_safety.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/script_setup.sh"
A=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear
  --normalization RMSNorm --position-embedding-type rope
  --num-experts 4 --seq-length 16 --eval-iters 0 --global-batch-size 8 --lr-decay-style cosine
  --lr-warmup-iters 2 --lr-decay-iters 1000 --log-interval 1)
P=(--expert-model-parallel-size 2 --use-distributed-optimizer)
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
losses() { sed -E 's/.*"iteration":([0-9]+).*"lm_loss":([^,}]+).*/\1 \2/' "$1"; }

"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 6 --metrics-file "$D/straight.jsonl" \
  >"$D/straight.log" 2>&1 || fail "straight run: $(tail -5 "$D/straight.log")"

# 1. Killed mid-save.
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 6 --save "$D/ck" --save-interval 2 \
  --fault-kill-during-save 1:4 >"$D/crash.log" 2>&1 && fail "the job survived a rank killed mid-save"
[ "$(cat "$D/ck/latest_checkpointed_iteration.txt")" = 2 ] || fail "the marker moved: $(cat "$D/ck/latest_checkpointed_iteration.txt")"
[ -d "$D/ck/iter_0000004.tmp" ] || fail "no partial save left by the killed rank (the fault did not fire mid-save)"
[ -e "$D/ck/iter_0000004" ] && fail "an incomplete iteration 4 became visible"
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 6 --save "$D/ck" --load "$D/ck" \
  --save-interval 2 --metrics-file "$D/resumed.jsonl" >"$D/resume.log" 2>&1 || fail "resume: $(tail -5 "$D/resume.log")"
grep -q "loaded checkpoint $D/ck/iter_0000002: iteration 2" "$D/resume.log" || fail "did not resume from iteration 2"
[ "$(cat "$D/ck/latest_checkpointed_iteration.txt")" = 6 ] || fail "the resumed run did not save iteration 6"
[ -e "$D/ck/iter_0000004.tmp" ] && fail "the stale temporary directory was not cleared"
diff <(losses "$D/straight.jsonl" | tail -n 4) <(losses "$D/resumed.jsonl") ||
  fail "the resumed run's losses differ from the uninterrupted run's"
echo "killed mid-save: iteration 2 kept, resumed bitwise ($(losses "$D/resumed.jsonl" | tail -n 1))"

# 2. SIGTERM to rank 1 only.
"${mpirun[@]}" -np 2 bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then echo $$ >"$1/rank1.pid"; fi; shift; exec "$@"' \
  _ "$D" "$moecore" train "${A[@]}" "${P[@]}" --train-iters 100000 --save "$D/sig" --metrics-file "$D/sig.jsonl" \
  >"$D/sig.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -s "$D/rank1.pid" ] && [ "$(lines "$D/sig.jsonl")" -ge 2 ] && break
  sleep 0.1
done
kill -TERM "$(cat "$D/rank1.pid")" || fail "rank 1 is not running"
wait $job || fail "SIGTERM: the job exited non-zero: $(tail -5 "$D/sig.log")"
it=$(sed -nE 's/^stopping at iteration ([0-9]+) on SIGTERM.*/\1/p' "$D/sig.log")
[ -n "$it" ] || fail "SIGTERM: no stop message: $(tail -5 "$D/sig.log")"
[ "$(cat "$D/sig/latest_checkpointed_iteration.txt")" = "$it" ] || fail "SIGTERM: no checkpoint at iteration $it"
echo "SIGTERM to one rank: both stopped at iteration $it with a checkpoint"

# 3. SIGINT to a single process.
"$moecore" train "${A[@]}" --train-iters 100000 --save "$D/int" --metrics-file "$D/int.jsonl" >"$D/int.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ "$(lines "$D/int.jsonl")" -ge 2 ] && break
  sleep 0.1
done
kill -INT $job
wait $job || fail "SIGINT: exited non-zero: $(tail -5 "$D/int.log")"
it=$(sed -nE 's/^stopping at iteration ([0-9]+) on SIGINT.*/\1/p' "$D/int.log")
[ -n "$it" ] && [ "$(cat "$D/int/latest_checkpointed_iteration.txt")" = "$it" ] ||
  fail "SIGINT: no checkpoint: $(tail -5 "$D/int.log")"
echo "SIGINT: stopped at iteration $it with a checkpoint"

# 4. Killed in the commit window.
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 2 --save "$D/win" \
  >"$D/win1.log" 2>&1 || fail "window, first run: $(tail -5 "$D/win1.log")"
mkdir "$D/marker2"
cp "$D/win/latest_checkpointed_iteration.txt" "$D/win/latest_checkpointed_iteration.json" "$D/marker2/"
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 4 --save "$D/win" --load "$D/win" \
  >"$D/win2.log" 2>&1 || fail "window, second run: $(tail -5 "$D/win2.log")"
cp "$D/marker2/"* "$D/win/"  # the marker update of iteration 4 never happened
sum4=$(cd "$D/win/iter_0000004" && md5sum ./*)
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 6 --save "$D/win" --load "$D/win" \
  --save-interval 2 --metrics-file "$D/win.jsonl" >"$D/win3.log" 2>&1 || fail "window, resume: $(tail -5 "$D/win3.log")"
grep -q "^note: set aside $D/win/iter_0000004 as iter_0000004.uncommitted-1: its save was never committed" \
  "$D/win3.log" || fail "window: no set-aside line: $(tail -5 "$D/win3.log")"
grep -q "loaded checkpoint $D/win/iter_0000002: iteration 2" "$D/win3.log" || fail "window: did not resume from 2"
[ "$(cd "$D/win/iter_0000004.uncommitted-1" && md5sum ./*)" = "$sum4" ] || fail "window: the set-aside save changed"
[ "$(cat "$D/win/latest_checkpointed_iteration.txt")" = 6 ] || fail "window: the resumed run did not save 6"
diff <(losses "$D/straight.jsonl" | tail -n 4) <(losses "$D/win.jsonl") ||
  fail "window: the resumed run's losses differ from the uninterrupted run's"
echo "killed in the commit window: iter_0000004 set aside as iter_0000004.uncommitted-1, trained on from 2 bitwise"
echo "crash safety: all checks passed"
