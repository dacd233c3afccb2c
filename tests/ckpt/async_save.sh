#!/usr/bin/env bash
# --async-save with real processes under mpirun (2 ranks, EP2, distributed optimizer):
#  1. the losses of a run saving every 2 iterations in the background equal a run without saves, bitwise, and its
#     checkpoints hold the same tensor bytes as synchronous saves;
#  2. rank 1 is SIGKILLed in the middle of the background write of iteration 4 (--fault-kill-during-save): the job
#     fails, the marker still names iteration 2 (committed before the next save began), whose checkpoint loads; the
#     resumed run reproduces the uninterrupted run's losses bitwise.
# Usage: async_save.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/script_setup.sh"
A=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear
  --num-experts 4 --seq-length 16 --eval-iters 0 --global-batch-size 8 --lr-decay-style cosine
  --lr-warmup-iters 2 --lr-decay-iters 1000 --log-interval 1 --expert-model-parallel-size 2
  --use-distributed-optimizer)
losses() { sed -E 's/.*"iteration":([0-9]+).*"lm_loss":([^,}]+).*/\1 \2/' "$1"; }

"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --train-iters 6 --metrics-file "$D/straight.jsonl" \
  >"$D/straight.log" 2>&1 || fail "straight run: $(tail -5 "$D/straight.log")"
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --train-iters 6 --save "$D/sync" --save-interval 2 \
  >"$D/sync.log" 2>&1 || fail "sync run: $(tail -5 "$D/sync.log")"

# 1. Bitwise with background saves.
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --train-iters 6 --save "$D/async" --save-interval 2 --async-save \
  --metrics-file "$D/async.jsonl" >"$D/async.log" 2>&1 || fail "async run: $(tail -5 "$D/async.log")"
diff <(losses "$D/straight.jsonl") <(losses "$D/async.jsonl") || fail "--async-save changed the losses"
grep -q "saving checkpoint at iteration 2 to .* in the background" "$D/async.log" || fail "no background save"
[ "$(cat "$D/async/latest_checkpointed_iteration.txt")" = 6 ] || fail "the async run's marker is not at 6"
for it in 0000002 0000004 0000006; do
  for r in 00000 00001; do
    cmp -s "$D/sync/iter_$it/model_rank$r.safetensors" "$D/async/iter_$it/model_rank$r.safetensors" ||
      fail "iteration $it rank $r: the background save wrote different bytes"
  done
done
echo "async save: bitwise losses and the same checkpoint bytes as synchronous saves"

# 2. Killed in the middle of a background write.
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --train-iters 6 --save "$D/ck" --save-interval 2 --async-save \
  --fault-kill-during-save 1:4 >"$D/crash.log" 2>&1 && fail "the job survived a rank killed mid-save"
[ "$(cat "$D/ck/latest_checkpointed_iteration.txt")" = 2 ] || fail "the marker moved: $(cat "$D/ck/latest_checkpointed_iteration.txt")"
[ -d "$D/ck/iter_0000004.tmp" ] || fail "no partial save left by the killed rank (the fault did not fire mid-save)"
[ -e "$D/ck/iter_0000004" ] && fail "an incomplete iteration 4 became visible"
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --train-iters 6 --save "$D/ck" --load "$D/ck" --async-save \
  --save-interval 2 --metrics-file "$D/resumed.jsonl" >"$D/resume.log" 2>&1 || fail "resume: $(tail -5 "$D/resume.log")"
grep -q "loaded checkpoint $D/ck/iter_0000002: iteration 2" "$D/resume.log" || fail "did not resume from iteration 2"
[ "$(cat "$D/ck/latest_checkpointed_iteration.txt")" = 6 ] || fail "the resumed run did not save iteration 6"
diff <(losses "$D/straight.jsonl" | tail -n 4) <(losses "$D/resumed.jsonl") ||
  fail "the resumed run's losses differ from the uninterrupted run's"
echo "async save killed mid-write: iteration 2 kept, resumed bitwise"
echo "async save: all checks passed"
