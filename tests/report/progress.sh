#!/usr/bin/env bash
# Training's progress on a terminal and in logs: under a pseudo-terminal (util-linux `script`) a single process
# redraws one line with iteration, loss, tokens/s and ETA; with output to a file the log is today's lines only
# (no carriage return, no progress line), the same log lines in both.
# Usage: progress.sh MOECORE
set -euo pipefail
moecore="$1"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
export OMP_NUM_THREADS=1
A=(--mock-data --vocab-size 64 --num-layers 1 --hidden-size 32 --normalization RMSNorm --position-embedding-type rope
  --num-attention-heads 2 --disable-bias-linear --num-experts 4 --seq-length 16 --global-batch-size 4
  --train-iters 6 --log-interval 3 --eval-iters 0)
script -qec "$(printf '%q ' "$moecore" train "${A[@]}")" "$D/tty.txt" >/dev/null
"$moecore" train "${A[@]}" >"$D/file.txt" 2>&1
fail() { echo "FAIL: $*"; exit 1; }
grep -aqP '\r\e\[Kiteration 5/6 \| lm loss [0-9.]+ \| [0-9]+ tokens/s \| ETA [0-9]+:[0-9]{2}' "$D/tty.txt" ||
  fail "no redrawn progress line on the terminal: $(tr '\r' '~' <"$D/tty.txt" | tail -5)"
grep -aq $'\r' "$D/file.txt" && fail "carriage returns in the log file"
grep -aq 'tokens/s | ETA' "$D/file.txt" && fail "a progress line in the log file"
tty_logs=$(tr '\r' '\n' <"$D/tty.txt" | sed 's/^\x1b\[K//' | grep -a '^ iteration' | sed 's/|.*//')
file_logs=$(grep -a '^ iteration' "$D/file.txt" | sed 's/|.*//')
[ -n "$file_logs" ] && [ "$tty_logs" = "$file_logs" ] || fail "log lines differ: [$tty_logs] vs [$file_logs]"
echo "progress: all checks passed"
