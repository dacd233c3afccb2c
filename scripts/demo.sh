#!/usr/bin/env bash
# The main job from a fresh clone: install dependencies, build, turn Debian's fortunes into a dataset with a
# small BPE vocabulary of its own, train the tiny-moe model (8 experts, top-2) on 2 MPI ranks with expert
# parallelism for a few minutes (checkpoints in demo/checkpoints), and sample fortunes from it, then again from the
# saved checkpoint with moecore generate, and draw the run in demo/report.html (moecore report: curves and
# expert-load heatmaps, one file that opens offline). Everything lands in demo/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target moecore
M=./build/moecore
mkdir -p demo
$M --version
$M corpus fortunes --output demo/fortunes.jsonl
$M train-tokenizer --input demo/fortunes.jsonl --json-keys text --vocab-size 4096 --output demo/tokenizer
$M preprocess --input demo/fortunes.jsonl --output-prefix demo/fortunes --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model demo/tokenizer --append-eod --workers "$(nproc)"
ITERS="${1:-400}"  # training steps; bash scripts/demo.sh 100 for a quicker look
# Each demo run trains afresh: its previous checkpoints are the demo's own (moecore refuses to overwrite
# checkpoints a run did not load).
rm -rf demo/checkpoints
# Two MPI ranks, the 8 experts split 4 + 4 between them (expert parallelism folded over data parallelism).
mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 $M train --model tiny-moe \
  --expert-model-parallel-size 2 \
  --data-path demo/fortunes_text_document --split 98,2,0 \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model demo/tokenizer \
  --train-iters "$ITERS" --log-interval 25 --eval-interval 100 --eval-iters 10 \
  --metrics-file demo/metrics.jsonl --save demo/checkpoints --save-interval 200 \
  --generate-prompts "The " "Q: What" "A man" --generate-tokens 40
echo "metrics (one JSON object per logged iteration): demo/metrics.jsonl"
# The saved model on one process, from the checkpoint alone (its tokenizer is saved with it).
$M generate --load demo/checkpoints --prompt "Q: Why" --prompt "You will" --tokens 40 --temperature 0.8 --top-k 20
# The run's curves and per-layer expert-load heatmaps, one self-contained HTML file.
$M report demo/metrics.jsonl --name tiny-moe -o demo/report.html
echo "report: demo/report.html (open it in a browser; it needs no network)"
