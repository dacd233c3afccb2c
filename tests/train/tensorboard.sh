#!/usr/bin/env bash
# --tensorboard-dir end to end: event files read back by an independent reader (tensorboard_reader.py: its own
# TFRecord parser and CRC-32C, TensorBoard's message definitions compiled by protoc, python3-protobuf) and checked
# tag by tag, step by step, against the metrics JSON lines of the same run:
#  1. one process: every Megatron tag moecore writes (per-layer MoE losses, timers at level 2 equal to the metrics
#     file's timer records, memory, validation ppl, world size, tokens-per-expert histograms equal to the metrics
#     file's);
#  2. two ranks, EP 2, and four, TP 2 (SP) x EP 2: one event file, written by the last rank, the histograms holding
#     every rank's tokens;
#  3. SIGTERM with --exit-signal-handler and a queue larger than the run: the records reach the file at the stop.
# Usage: tensorboard.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/../ckpt/script_setup.sh"
reader="$(dirname "$0")/tensorboard_reader.py"
python3=/usr/bin/python3  # Debian's, with python3-protobuf (not a python3 earlier on PATH)
A=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear
  --num-experts 4 --moe-layer-freq "[0,1]" --seq-length 16 --micro-batch-size 2 --log-interval 1
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-per-layer-logging)
export OMP_NUM_THREADS=1

# 1. One process, every switch on.
"$moecore" train "${A[@]}" --train-iters 6 --global-batch-size 4 --eval-interval 3 --eval-iters 1 \
  --tensorboard-dir "$D/one" --metrics-file "$D/one.jsonl" --log-timers-to-tensorboard --timing-log-level 2 \
  --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --tensorboard-queue-size 7 \
  >"$D/one.log" 2>&1 || fail "one process: $(tail -5 "$D/one.log")"
"$python3" "$reader" check "$D/one" "$D/one.jsonl" --global-batch-size 4 --world-size 1 --per-layer 2 --timers \
  --memory --ppl --last-iteration 6 || fail "one process: the event file does not match the metrics"

# 2. Two ranks, EP 2 (DP 2): rank 1 writes; the metrics file (rank 0) has rank 0's tokens, the histogram all 8x16x2.
"${mpirun[@]}" -np 2 "$moecore" train "${A[@]}" --train-iters 4 --global-batch-size 8 --eval-iters 0 \
  --expert-model-parallel-size 2 --tensorboard-dir "$D/ep2" --metrics-file "$D/ep2.jsonl" \
  --log-world-size-to-tensorboard >"$D/ep2.log" 2>&1 || fail "EP 2: $(tail -5 "$D/ep2.log")"
"$python3" "$reader" check "$D/ep2" "$D/ep2.jsonl" --global-batch-size 8 --world-size 2 --per-layer 2 \
  --no-metrics-tokens --tokens-per-layer 256 --last-iteration 4 || fail "EP 2: the event file does not match"

# 2b. Four ranks, TP 2 with SP and EP 2: each TP rank routes its sequence shard; the histograms still hold 256.
"${mpirun[@]}" -np 4 "$moecore" train "${A[@]}" --train-iters 2 --global-batch-size 8 --eval-iters 0 \
  --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 --expert-tensor-parallel-size 1 \
  --tensorboard-dir "$D/tp2" --metrics-file "$D/tp2.jsonl" >"$D/tp2.log" 2>&1 ||
  fail "TP 2 EP 2: $(tail -5 "$D/tp2.log")"
"$python3" "$reader" check "$D/tp2" "$D/tp2.jsonl" --global-batch-size 8 --per-layer 2 --no-metrics-tokens \
  --tokens-per-layer 256 --last-iteration 2 || fail "TP 2 EP 2: the event file does not match"

# 3. SIGTERM: nothing reaches the file before the stop (queue of 100000 records), all of it after.
"$moecore" train "${A[@]}" --train-iters 100000 --global-batch-size 4 --eval-iters 0 --lr-decay-style constant \
  --exit-signal-handler --tensorboard-dir "$D/term" --tensorboard-queue-size 100000 --metrics-file "$D/term.jsonl" \
  >"$D/term.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -f "$D/term.jsonl" ] && [ "$(wc -l <"$D/term.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -TERM $job
wait $job || fail "SIGTERM: the job exited non-zero: $(tail -5 "$D/term.log")"
it=$(sed -nE 's/^stopping at iteration ([0-9]+) on SIGTERM.*/\1/p' "$D/term.log")
[ -n "$it" ] || fail "SIGTERM: no stop message: $(tail -5 "$D/term.log")"
"$python3" "$reader" check "$D/term" "$D/term.jsonl" --global-batch-size 4 --per-layer 2 --last-iteration "$it" ||
  fail "SIGTERM: the event file does not hold every step up to $it"
echo "tensorboard: all checks passed"
