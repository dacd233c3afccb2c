#!/usr/bin/env bash
# Stop signals reach every rank and end the job at a step boundary with a checkpoint, whoever is signalled:
#  1. SIGUSR1 to mpirun itself (Open MPI forwards it to every rank): saves, exits 0, and the run resumes from it;
#  2. SIGTERM to `moecore launch` (the launcher in front of mpirun): saves and exits 0;
#  3. SIGINT twice to `moecore launch`: the job ends at once; the checkpoint saved before is untouched and the
#     marker names a complete checkpoint;
#  4. SIGINT twice to a single process: exits at once (status 130) without a new checkpoint;
#  5. --exit-signal-handler --exit-signal SIGHUP without --save: stops at a step boundary, exits 0, saves nothing;
#  6. SIGTERM to a bare mpirun (Open MPI's kill sequence: SIGCONT, SIGTERM a second later, SIGKILL a second after
#     that): the ranks take the SIGCONT as the stop request, save and exit 0 before the SIGKILL (mpirun itself
#     exits 1, Open MPI's status for a job it was told to end);
#  7. Ctrl-Z / fg through mpirun (SIGTSTP then SIGCONT, both forwarded) and a scheduler's suspend / resume of the
#     ranks (SIGSTOP then SIGCONT): training goes on; SIGINT to the bare mpirun then stops it with a checkpoint.
# Every case runs beside two busy processes (started here, ended on exit): the stop must reach the ranks, and their
# save finish, within Open MPI's kill sequence on a loaded machine too. The single-process cases (4, 5) keep their
# OpenMP threads (a signal may land on any of them) but let them wait passively: spinning against the busy
# processes made each step several times slower and tested nothing more.
# Usage: signals.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/script_setup.sh"
busy=()
for _ in 1 2; do
  yes >/dev/null &
  busy+=($!)
done
trap 'kill "${busy[@]}"; rm -rf "$D"' EXIT
A=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear
  --normalization RMSNorm --position-embedding-type rope
  --num-experts 4 --seq-length 16 --eval-iters 0 --global-batch-size 8 --lr-decay-style constant --lr-decay-iters 1000
  --log-interval 1)
P=(--expert-model-parallel-size 2 --use-distributed-optimizer)
# mpirun's own options, for `moecore launch --mpirun-arg`.
L=()
for a in "${mpirun[@]:1}"; do L+=(--mpirun-arg "$a"); done
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
wait_lines() {  # FILE N: until FILE has N lines (60 s at most)
  for _ in $(seq 600); do
    [ "$(lines "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "no progress in $1"
}
stopped_at() { sed -nE "s/^stopping at iteration ([0-9]+) on $2.*/\1/p" "$1"; }
stop_job() {  # PID SIGNAL LOG EXPECTED: signal the job, which must exit 0 saying it stopped on EXPECTED; sets $it
  kill "-$2" "$1"
  wait "$1" || fail "SIG$2: the job exited non-zero: $(tail -5 "$3")"
  it=$(stopped_at "$3" "$4")
  [ -n "$it" ] || fail "SIG$2: no stop message: $(tail -5 "$3")"
}

# 1. SIGUSR1 to mpirun.
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters 100000 --save "$D/usr1" \
  --metrics-file "$D/usr1.jsonl" >"$D/usr1.log" 2>&1 &
job=$!
wait_lines "$D/usr1.jsonl" 3
stop_job $job USR1 "$D/usr1.log" SIGUSR1
[ "$(cat "$D/usr1/latest_checkpointed_iteration.txt")" = "$it" ] || fail "SIGUSR1 to mpirun: no checkpoint at $it"
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" "${P[@]}" --train-iters $((it + 2)) --save "$D/usr1" \
  --load "$D/usr1" >"$D/usr1_resume.log" 2>&1 || fail "resume after SIGUSR1: $(tail -5 "$D/usr1_resume.log")"
grep -q "loaded checkpoint $D/usr1/iter_$(printf %07d "$it"): iteration $it" "$D/usr1_resume.log" ||
  fail "the resumed run did not start from iteration $it"
echo "SIGUSR1 to mpirun: every rank stopped at iteration $it with a checkpoint, and the run resumed from it"

# 2. SIGTERM to the launcher.
"$moecore" launch --nproc-per-node 2 "${L[@]}" --mpirun "${mpirun[0]}" -- train "${A[@]}" "${P[@]}" \
  --train-iters 100000 --save "$D/term" --metrics-file "$D/term.jsonl" >"$D/term.log" 2>&1 &
job=$!
wait_lines "$D/term.jsonl" 3
stop_job $job TERM "$D/term.log" SIGUSR1
[ "$(cat "$D/term/latest_checkpointed_iteration.txt")" = "$it" ] || fail "SIGTERM to moecore launch: no checkpoint"
echo "SIGTERM to moecore launch: every rank stopped at iteration $it with a checkpoint"

# 3. SIGINT twice to the launcher, after a first checkpoint.
"$moecore" launch --nproc-per-node 2 "${L[@]}" --mpirun "${mpirun[0]}" -- train "${A[@]}" "${P[@]}" \
  --train-iters 100000 --save "$D/int2" --save-interval 2 --metrics-file "$D/int2.jsonl" >"$D/int2.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -f "$D/int2/latest_checkpointed_iteration.txt" ] && break
  sleep 0.1
done
first=$(cat "$D/int2/latest_checkpointed_iteration.txt")
before=$(cd "$D/int2" && md5sum "iter_$(printf %07d "$first")"/*)
kill -INT $job
kill -INT $job
start=$(date +%s)
wait $job
took=$(($(date +%s) - start))
[ "$took" -le 10 ] || fail "two SIGINTs: the job took ${took}s to end"
after=$(cd "$D/int2" && md5sum "iter_$(printf %07d "$first")"/*)
[ "$before" = "$after" ] || fail "two SIGINTs: the checkpoint of iteration $first changed"
last=$(cat "$D/int2/latest_checkpointed_iteration.txt")
[ -f "$D/int2/iter_$(printf %07d "$last")/index.json" ] || fail "two SIGINTs: the marker names an incomplete $last"
echo "two SIGINTs to moecore launch: ended in ${took}s; iteration $first untouched, the marker names iteration $last"

# 4. SIGINT twice to a single process (a larger model, so a step outlasts the gap between the signals).
B=(--mock-data --vocab-size 4096 --num-layers 2 --hidden-size 256 --num-attention-heads 4 --disable-bias-linear
  --normalization RMSNorm --position-embedding-type rope
  --num-experts 4 --seq-length 256 --micro-batch-size 4 --global-batch-size 8 --eval-iters 0
  --lr-decay-style constant --log-interval 1)
OMP_WAIT_POLICY=passive "$moecore" train "${B[@]}" --train-iters 100000 --save "$D/one" --save-interval 1 \
  --metrics-file "$D/one.jsonl" >"$D/one.log" 2>&1 &
job=$!
wait_lines "$D/one.jsonl" 2
kill -INT $job
sleep 0.05
kill -INT $job
wait $job
rc=$?
[ "$rc" = 130 ] || fail "two SIGINTs to one process: status $rc, not 130: $(tail -3 "$D/one.log")"
grep -q "second SIGINT: exiting at once" "$D/one.log" || fail "two SIGINTs: no message"
last=$(cat "$D/one/latest_checkpointed_iteration.txt")
[ -f "$D/one/iter_$(printf %07d "$last")/index.json" ] || fail "two SIGINTs to one process: marker names $last"
echo "two SIGINTs to one process: exited at once (130), the marker names the complete iteration $last"

# 5. --exit-signal-handler --exit-signal SIGHUP, no --save.
OMP_WAIT_POLICY=passive "$moecore" train "${A[@]}" --train-iters 100000 --exit-signal-handler --exit-signal SIGHUP \
  --metrics-file "$D/hup.jsonl" >"$D/hup.log" 2>&1 &
job=$!
wait_lines "$D/hup.jsonl" 2
stop_job $job HUP "$D/hup.log" SIGHUP
grep -q "saved checkpoint" "$D/hup.log" && fail "SIGHUP without --save saved a checkpoint"
echo "--exit-signal SIGHUP: stopped at iteration $it, exit 0, nothing saved"

# 6. SIGTERM to a bare mpirun. The stop comes from the SIGCONT, or from the SIGTERM a second later when a loaded
# machine kept the ticker the SIGCONT is judged by off the CPU for half a second (which looks like a stop).
KILLSEQ="(SIGCONT while running|SIGTERM)"
# mpirun does not drain the ranks' output while it waits between its signals: a rank logging every few
# milliseconds would block on a full pty before its next step boundary, so these runs log every 50 steps (a metrics
# line each, beside any alarm's: the first shows training under way, two more after a resume that it goes on).
Q=()
prev=""
for a in "${A[@]}"; do
  if [ "$prev" = --log-interval ]; then Q+=(50); else Q+=("$a"); fi
  prev=$a
done
"${mpirun[@]}" -np 2 "$moecore" train "${Q[@]}" "${P[@]}" --train-iters 100000 --save "$D/bare" \
  --metrics-file "$D/bare.jsonl" >"$D/bare.log" 2>&1 &
job=$!
wait_lines "$D/bare.jsonl" 1
kill -TERM $job
wait $job
rc=$?
it=$(stopped_at "$D/bare.log" "$KILLSEQ")
[ -n "$it" ] || fail "SIGTERM to mpirun: no stop message (status $rc): $(tail -5 "$D/bare.log")"
[ "$(cat "$D/bare/latest_checkpointed_iteration.txt")" = "$it" ] || fail "SIGTERM to mpirun: no checkpoint at $it"
[ -f "$D/bare/iter_$(printf %07d "$it")/index.json" ] || fail "SIGTERM to mpirun: iteration $it incomplete"
echo "SIGTERM to a bare mpirun: every rank stopped at iteration $it with a checkpoint (mpirun status $rc)"

# 7. Job control and suspend / resume go on training; then SIGINT to the bare mpirun saves.
"${mpirun[@]}" -np 2 "$moecore" train "${Q[@]}" "${P[@]}" --train-iters 100000 --save "$D/jobctl" \
  --metrics-file "$D/jobctl.jsonl" >"$D/jobctl.log" 2>&1 &
job=$!
wait_lines "$D/jobctl.jsonl" 1
kill -TSTP $job
sleep 2
kill -CONT $job
n=$(lines "$D/jobctl.jsonl")
wait_lines "$D/jobctl.jsonl" $((n + 2))
ranks=$(pgrep -P $job -f "train")
[ -n "$ranks" ] || fail "job control: no rank processes under mpirun $job"
kill -STOP $ranks
sleep 2
kill -CONT $ranks
n=$(lines "$D/jobctl.jsonl")
wait_lines "$D/jobctl.jsonl" $((n + 2))
grep -q "^stopping" "$D/jobctl.log" && fail "a resume after a stop was taken for a kill sequence: $(tail -3 "$D/jobctl.log")"
# A SIGCONT within a second of a resume counts as that resume: let the second pass before the SIGINT. (Without
# the verdict the ranks would wait for Open MPI's SIGTERM, and meanwhile block on output mpirun is not draining.)
sleep 2
kill -INT $job
wait $job
it=$(stopped_at "$D/jobctl.log" "$KILLSEQ")
[ -n "$it" ] || fail "SIGINT to mpirun: no stop message: $(tail -5 "$D/jobctl.log")"
[ "$(cat "$D/jobctl/latest_checkpointed_iteration.txt")" = "$it" ] || fail "SIGINT to mpirun: no checkpoint at $it"
echo "Ctrl-Z/fg and SIGSTOP/SIGCONT went on training; SIGINT to a bare mpirun then stopped at $it with a checkpoint"
echo "signals: all checks passed"
