#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded number of iterations from a seed corpus
# (a valid .idx and a small trained tokenizer.json made by the moecore binary). Usage: run.sh MOECORE_BIN RUNS
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
moecore="$1"
runs="${2:-20000}"
work="$(dirname "$moecore")/fuzz"
mkdir -p "$work"
cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$work/build" | grep -v "^\[" || true
test -x "$work/build/fuzz_index" && test -x "$work/build/fuzz_tokenizer_json"
# Seeds: a real preprocess output and a trained tokenizer.
seeds="$work/seeds"
rm -rf "$seeds" && mkdir -p "$seeds/idx" "$seeds/tok"
printf 'the cat sat on the mat\nthe dog sat\n' > "$seeds/text.txt"
"$moecore" train-tokenizer --input "$seeds/text.txt" --vocab-size 270 --output "$seeds/tk" >/dev/null
cp "$seeds/tk/tokenizer.json" "$seeds/tok/seed.json"
printf '{"text": "the cat"}\n{"text": ""}\n{"text": "sat on the mat"}\n' > "$seeds/in.jsonl"
"$moecore" preprocess --input "$seeds/in.jsonl" --output-prefix "$seeds/p" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$seeds/tk" --append-eod --workers 1 >/dev/null 2>&1
binsize=$(stat -c %s "$seeds/p_text_document.bin")
python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<I', $binsize))" > "$seeds/idx/seed"
cat "$seeds/p_text_document.idx" >> "$seeds/idx/seed"
for t in fuzz_index:idx fuzz_tokenizer_json:tok; do
  exe="${t%%:*}"; dir="${t##*:}"
  echo "fuzzing $exe"
  n=$runs; [ "$exe" = fuzz_index ] && n=$((runs * 10))
  "$work/build/$exe" -runs="$n" -max_len=8192 -rss_limit_mb=2048 -timeout=20 "$seeds/$dir" 2>&1 | tail -3
done
echo "fuzz: all targets completed $runs runs without a finding"
