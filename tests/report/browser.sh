#!/usr/bin/env bash
# `moecore report` in a real browser: two tiny runs (one named with markup), their report loaded by headless
# Chromium, which must draw every planned chart with no script error or console message and no markup from a run
# name in the page; a copy with a broken drawing call must be caught (the check can fail). The screenshot stays in
# OUT_DIR as the test's artifact. Skips (exit 77) only when chromium is not installed.
# Usage: browser.sh MOECORE OUT_DIR
set -euo pipefail
MOECORE="$1"
OUT="$2"
if ! command -v chromium >/dev/null 2>&1; then
  echo "SKIP: chromium is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
rm -rf "$OUT"
mkdir -p "$OUT"
cd "$OUT"
export OMP_NUM_THREADS=1
TINY=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --normalization RMSNorm
  --position-embedding-type rope --num-attention-heads 2 --disable-bias-linear --num-experts 4 --seq-length 16
  --global-batch-size 4 --train-iters 24 --lr-warmup-iters 2 --log-interval 2 --eval-interval 8 --eval-iters 1
  --moe-per-layer-logging --moe-z-loss-coeff 1e-3)
"$MOECORE" train "${TINY[@]}" --moe-aux-loss-coeff 1e-2 --metrics-file a.jsonl >a.log
"$MOECORE" train "${TINY[@]}" --moe-aux-loss-coeff 0 --seed 7 --metrics-file b.jsonl >b.log
EVIL='<img src=x onerror="document.title=1">'
"$MOECORE" report a.jsonl b.jsonl --name "aux 1e-2" --name "$EVIL" -o report.html | tee report.log
# 2 runs x 2 MoE layers: loss, lr, grad norm, tokens/s, MFU, memory, aux+z, max/mean, entropy, 2 per-layer losses,
# timers, and 4 heatmaps.
EXPECTED=16
grep -q "2 run(s), $EXPECTED charts" report.log || { echo "FAIL: the report plans other than $EXPECTED charts"; exit 1; }

CHROME=(chromium --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars --enable-logging=stderr --v=0
  --virtual-time-budget=5000)
# load PAGE: the DOM after load into PAGE.dom, console messages into PAGE.console
load() {
  timeout 120 "${CHROME[@]}" --dump-dom "file://$OUT/$1" >"$1.dom" 2>"$1.stderr" || true
  grep -a ':CONSOLE' "$1.stderr" >"$1.console" || true
}
attr() { grep -ao "<body[^>]*" "$1.dom" | head -1 | grep -o "$2=\"[0-9]*\"" | grep -o '[0-9]*' || true; }
html_errors() { grep -ao '<html[^>]*' "$1.dom" | grep -o 'data-errors="[0-9]*"' | grep -o '[0-9]*' || echo 0; }

load report.html
charts=$(attr report.html data-charts)
expected=$(attr report.html data-expected-charts)
errors=$(html_errors report.html)
echo "browser: drew ${charts:-?} of ${expected:-?} charts, ${errors} script errors, $(wc -l <report.html.console) console messages"
[ "$charts" = "$EXPECTED" ] && [ "$expected" = "$EXPECTED" ] || { echo "FAIL: charts drawn"; cat report.html.stderr; exit 1; }
[ "$errors" = 0 ] && [ ! -s report.html.console ] || { echo "FAIL: console:"; cat report.html.console; exit 1; }
grep -q "<title>moecore report: aux 1e-2, &lt;img" report.html.dom || { echo "FAIL: title"; exit 1; }
if grep -aq '<img src=x' report.html.dom; then echo "FAIL: a run name became markup"; exit 1; fi

# The check itself: a page whose drawing call fails must be seen as failing.
sed 's/echarts\.init(div/echarts.initBroken(div/' report.html >broken.html
load broken.html
[ "$(attr broken.html data-charts)" = 0 ] && [ "$(html_errors broken.html)" = "$EXPECTED" ] && [ -s broken.html.console ] ||
  { echo "FAIL: a broken page was not caught"; exit 1; }

timeout 120 "${CHROME[@]}" --window-size=1400,2600 --screenshot="$OUT/report.png" "file://$OUT/report.html" \
  >/dev/null 2>&1 || true
[ -s report.png ] || { echo "FAIL: no screenshot"; exit 1; }
echo "report browser test: all checks passed (screenshot $OUT/report.png)"
