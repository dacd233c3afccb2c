#!/usr/bin/env bash
# moecore generate --load: a model trained (on real text with its own tokenizer) and saved on 2 ranks with expert
# parallelism, loaded on one process from the checkpoint alone (the tokenizer travels with it), continues a prompt
# exactly as the training run itself did at its end, greedy and sampled.
# Usage: generate.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/script_setup.sh"
cd "$D" || exit 1
"$moecore" corpus fortunes --output f.jsonl >/dev/null || fail "corpus"
"$moecore" train-tokenizer --input f.jsonl --json-keys text --vocab-size 512 --output tok >/dev/null || fail "tokenizer"
"$moecore" preprocess --input f.jsonl --output-prefix f --tokenizer-type HuggingFaceTokenizer --tokenizer-model tok \
  --append-eod --workers 2 >/dev/null 2>&1 || fail "preprocess"
"${mpirun[@]}" -np 2 "$moecore" train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --swiglu \
  --normalization RMSNorm --position-embedding-type rope \
  --disable-bias-linear --num-experts 4 --moe-ffn-hidden-size 64 --seq-length 64 --micro-batch-size 4 \
  --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 3 --train-iters 30 --data-path f_text_document \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model tok --eval-iters 2 --log-interval 10 \
  --expert-model-parallel-size 2 --save ck --generate-prompts "A man" --generate-tokens 16 >train.log 2>&1 ||
  fail "train: $(tail -5 train.log)"
rm -rf tok  # the checkpoint must carry everything generation needs
# The training run's own samples: the text after "--- greedy: " up to the sampled line, and the sampled text to the end.
greedy=$(sed -n '/^--- greedy: /,/^--- sampled/p' train.log | sed '$d' | sed '1s/^--- greedy: //')
sampled=$(sed -n '/^--- sampled (temperature 0.8, top-k 20): /,$p' train.log | sed '1s/^--- sampled[^:]*: //')
got=$("$moecore" generate --load ck --prompt "A man" --tokens 16 2>gen.err) || fail "generate: $(cat gen.err)"
[ "$got" = "$greedy" ] || fail "greedy: generate gave [$got], training gave [$greedy]"
got=$("$moecore" generate --load ck --prompt "A man" --tokens 16 --temperature 0.8 --top-k 20 2>>gen.err) ||
  fail "generate: $(cat gen.err)"
[ "$got" = "$sampled" ] || fail "sampled: generate gave [$got], training gave [$sampled]"
grep -q "iteration 30" gen.err || fail "generate did not report the checkpoint's iteration: $(cat gen.err)"
echo "generate from the checkpoint matches the training run: greedy [$greedy], sampled [$sampled]"
