#!/usr/bin/env bash
# The metrics file's routing statistics are the step's over all ranks (what `moecore report` draws): on 2 ranks
# (EP 2) and 4 (TP 2 with SP, EP 2), every layer's tokens_per_expert sums to global batch x sequence x top-k (256),
# not one rank's share, and the router entropy is a mean over tokens (below ln E).
# Usage: global_routing.sh MOECORE MPIRUN [MPIRUN ARGS...]
set -euo pipefail
moecore="$1"
shift
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
A=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear
  --num-experts 4 --seq-length 16 --micro-batch-size 2 --log-interval 1 --train-iters 2 --global-batch-size 8
  --eval-iters 0 --expert-model-parallel-size 2)
check() {  # check FILE: every logged layer holds 256 assignments
  python3 - "$1" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert rows, "no rows"
for r in rows:
    for layer, tpe in r["tokens_per_expert"].items():
        assert sum(tpe) == 256, f"iteration {r['iteration']} {layer}: {sum(tpe)} assignments, expected 256"
        h = r["router_entropy"][layer]
        assert 0 < h < math.log(4), f"{layer} entropy {h}"
print(f"{sys.argv[1]}: {len(rows)} rows, 256 assignments per layer")
PY
}
"$@" -np 2 "$moecore" train "${A[@]}" --metrics-file "$D/ep2.jsonl" >"$D/ep2.log" 2>&1 || { tail "$D/ep2.log"; exit 1; }
check "$D/ep2.jsonl"
"$@" -np 4 "$moecore" train "${A[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
  --expert-tensor-parallel-size 1 --metrics-file "$D/tp2.jsonl" >"$D/tp2.log" 2>&1 || { tail "$D/tp2.log"; exit 1; }
check "$D/tp2.jsonl"
echo "global routing statistics: all checks passed"
