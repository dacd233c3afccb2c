#!/usr/bin/env bash
# moecore generate --device cuda: a checkpoint trained on the CPU continues a prompt greedily on the GPU with the
# CPU's tokens, and one trained on the GPU samples the same tokens on either device. Without a usable GPU it says so
# and exits 77 (CTest: skipped). Usage: generate_cuda.sh MOECORE
source "$(dirname "$0")/script_setup.sh"
cd "$D" || exit 1
probe=$("$moecore" generate --load nothing --prompt x --device cuda 2>&1)
if echo "$probe" | grep -Eq -- "--device cuda: (this moecore was built without CUDA|no GPU is visible)"; then
  echo "generate on the GPU: skipped, no usable GPU"
  exit 77
fi
# FORTUNES_DIR: the fortunes where Debian's package is not installed (a GPU machine's pack, scripts/gpu-pack.sh).
"$moecore" corpus fortunes --output f.jsonl ${FORTUNES_DIR:+--source-dir "$FORTUNES_DIR"} >/dev/null || fail "corpus"
"$moecore" train-tokenizer --input f.jsonl --json-keys text --vocab-size 512 --output tok >/dev/null || fail "tokenizer"
"$moecore" preprocess --input f.jsonl --output-prefix f --tokenizer-type HuggingFaceTokenizer --tokenizer-model tok \
  --append-eod --workers 2 >/dev/null 2>&1 || fail "preprocess"
train() {  # DEVICE DIR
  "$moecore" train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --swiglu --normalization RMSNorm \
    --position-embedding-type rope --disable-bias-linear --num-experts 4 --moe-ffn-hidden-size 64 --seq-length 64 \
    --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 3 --train-iters 20 \
    --data-path f_text_document --tokenizer-type HuggingFaceTokenizer --tokenizer-model tok --eval-iters 1 \
    --log-interval 10 --hidden-dropout 0 --attention-dropout 0 --device "$1" --save "$2" >"$2.log" 2>&1 ||
    fail "train on $1: $(tail -5 "$2.log")"
}
gen() {  # DIR DEVICE [ARGS...]
  local dir=$1 dev=$2
  shift 2
  "$moecore" generate --load "$dir" --prompt "A man" --tokens 24 --device "$dev" "$@" 2>>gen.err ||
    fail "generate on $dev: $(cat gen.err)"
}
train cpu ck_cpu
cpu=$(gen ck_cpu cpu)
gpu=$(gen ck_cpu cuda)
[ "$cpu" = "$gpu" ] || fail "greedy: the GPU gave [$gpu], the CPU [$cpu]"
grep -q "on cuda:0" gen.err || fail "generate did not run on the GPU: $(cat gen.err)"
train cuda ck_gpu
cpu=$(gen ck_gpu cpu --temperature 0.8 --top-k 20 --seed 5)
gpu=$(gen ck_gpu cuda --temperature 0.8 --top-k 20 --seed 5)
[ "$cpu" = "$gpu" ] || fail "sampled from the GPU-trained checkpoint: the GPU gave [$gpu], the CPU [$cpu]"
echo "generate on the GPU matches the CPU: greedy and sampled"
