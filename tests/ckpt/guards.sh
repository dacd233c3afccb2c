#!/usr/bin/env bash
# Checkpoint guards and I/O errors at the command line (one process; no privileges needed):
#  1. a fresh run whose --save holds complete checkpoints is refused before training, every file unchanged;
#  2. the marker removed: --load D --save D is refused listing the iteration directories (never a fresh start that
#     would overwrite them); --ckpt-step 4 resumes iteration 4 and saves on; the marker stays a plain integer;
#  3. --load of a .tmp directory is refused by name;
#  4. --save under a regular file is refused before the first step;
#  5. --metrics-file /dev/full ends the run naming the file and ENOSPC;
#  6. a full disk during a save (ulimit -f, SIGXFSZ ignored: EFBIG) ends the run naming the file and leaves the
#     previous checkpoint, the marker and its sidecar exactly as they were;
#  7. a full disk while train-tokenizer replaces its output ends it naming the file; the earlier tokenizer stays;
#  8. --load of a Megatron torch_dist checkpoint (Megatron's launch line: --ckpt-format torch_dist --load D --save D)
#     is refused naming its format and files, before training and with every file unchanged;
#  9. --verify-integrity (Megatron's): each save writes integrity.json (every other file with its hash); a load with it
#     resumes when nothing changed, and is refused before training naming the file when a byte of a shard changed,
#     or naming the manifest when the checkpoint was saved without it; --ckpt-format torch_dist goes with it, torch_dcp
#     is refused as in Megatron.
# Usage: guards.sh MOECORE MPIRUN [MPIRUN ARGS...]
source "$(dirname "$0")/script_setup.sh"
A=(--mock-data --vocab-size 64 --num-layers 2 --num-attention-heads 2 --disable-bias-linear
  --normalization RMSNorm --position-embedding-type rope
  --num-experts 4 --seq-length 16 --eval-iters 0 --global-batch-size 8 --lr-decay-style constant --lr-decay-iters 1000 --log-interval 1)
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
H=(--hidden-size 32)
train() { "$moecore" train "${A[@]}" "${H[@]}" "$@"; }
big() { "$moecore" train "${A[@]}" --hidden-size 128 "$@"; }

train --train-iters 4 --save "$D/ck" --save-interval 2 >"$D/first.log" 2>&1 || fail "first run: $(tail -3 "$D/first.log")"
[ "$(cat "$D/ck/latest_checkpointed_iteration.txt")" = 4 ] || fail "the marker is not Megatron's plain integer"
[ -f "$D/ck/latest_checkpointed_iteration.json" ] || fail "no marker sidecar"
before=$(sums "$D/ck")

# 1. A fresh run into a directory of checkpoints.
train --train-iters 4 --save "$D/ck" >"$D/fresh.log" 2>&1 && fail "a fresh run was allowed to save over checkpoints"
grep -q -- "--save $D/ck already holds complete checkpoints (iter_0000002, iter_0000004) and this run loads none" \
  "$D/fresh.log" || fail "fresh run: $(tail -3 "$D/fresh.log")"
grep -q "iteration .*/" "$D/fresh.log" && fail "the refused run trained"
[ "$(sums "$D/ck")" = "$before" ] || fail "a refused run changed the checkpoints"
echo "fresh run over checkpoints: refused before training"

# 2. The marker missing.
rm "$D/ck/latest_checkpointed_iteration.txt"
before=$(sums "$D/ck")
train --train-iters 6 --load "$D/ck" --save "$D/ck" >"$D/nomarker.log" 2>&1 && fail "loaded without a marker"
grep -q "holds complete checkpoints: iter_0000002, iter_0000004; choose one with --ckpt-step N" "$D/nomarker.log" ||
  fail "no marker: $(tail -3 "$D/nomarker.log")"
[ "$(sums "$D/ck")" = "$before" ] || fail "the refused run changed the checkpoints"
train --train-iters 6 --load "$D/ck" --save "$D/ck" --ckpt-step 4 >"$D/step.log" 2>&1 ||
  fail "--ckpt-step 4: $(tail -3 "$D/step.log")"
grep -q "loaded checkpoint $D/ck/iter_0000004: iteration 4" "$D/step.log" || fail "--ckpt-step 4 did not load 4"
[ "$(cat "$D/ck/latest_checkpointed_iteration.txt")" = 6 ] || fail "no save at iteration 6"
echo "no marker: refused listing the iterations; --ckpt-step 4 resumed"

# 3. A temporary directory.
cp -r "$D/ck/iter_0000006" "$D/ck/iter_0000008.tmp"
train --train-iters 10 --load "$D/ck/iter_0000008.tmp" >"$D/tmp.log" 2>&1 && fail "loaded a .tmp directory"
grep -q -- "--load $D/ck/iter_0000008.tmp is the temporary directory of a checkpoint save that did not finish" \
  "$D/tmp.log" || fail ".tmp: $(tail -3 "$D/tmp.log")"
rm -r "$D/ck/iter_0000008.tmp"
echo ".tmp directory: refused by name"

# 4. An unwritable --save.
touch "$D/file"
train --train-iters 2 --save "$D/file/ck" >"$D/unwritable.log" 2>&1 && fail "saved under a regular file"
grep -q -- "--save $D/file/ck: cannot create the directory" "$D/unwritable.log" ||
  fail "unwritable: $(tail -3 "$D/unwritable.log")"
grep -q "iteration .*/" "$D/unwritable.log" && fail "the refused run trained"
echo "unwritable --save: refused before the first step"

# 5. The metrics file on a full device.
train --train-iters 2 --metrics-file /dev/full >"$D/full.log" 2>&1 && fail "a full metrics device went unnoticed"
grep -q "cannot write /dev/full: No space left on device" "$D/full.log" || fail "/dev/full: $(tail -3 "$D/full.log")"
echo "metrics file on a full device: the run ended naming it"

# 6. A full disk during a save. MPI's start-up needs a few MiB of files, so the model is made larger than the
#    limit (hidden 128: about 20 MB per checkpoint) and the limit set to 8 MiB.
big --train-iters 2 --save "$D/big" >"$D/big.log" 2>&1 || fail "big: $(tail -3 "$D/big.log")"
before=$(sums "$D/big")
(
  trap '' XFSZ
  ulimit -f 8192
  exec "$moecore" train "${A[@]}" --hidden-size 128 --train-iters 4 --load "$D/big" --save "$D/big"
) >"$D/efbig.log" 2>&1 && fail "a save on a full disk went unnoticed"
grep -q "cannot write $D/big/iter_0000004.tmp/model_rank00000.safetensors: File too large" "$D/efbig.log" ||
  fail "full disk: $(tail -3 "$D/efbig.log")"
[ "$(sums "$D/big")" = "$before" ] || fail "a failed save changed the previous checkpoint or the marker"
[ -e "$D/big/iter_0000004.tmp" ] && fail "the failed save left its temporary directory"
echo "full disk during a save: the run ended naming the file; iteration 2 intact"
# 7. train-tokenizer on a full disk.
for i in $(seq 300); do echo "the quick brown fox $i jumps over the lazy dog"; done >"$D/corpus.txt"
"$moecore" train-tokenizer --input "$D/corpus.txt" --vocab-size 400 --output "$D/tok" >"$D/tok.log" 2>&1 ||
  fail "train-tokenizer: $(tail -3 "$D/tok.log")"
before=$(sums "$D/tok")
(
  trap '' XFSZ
  ulimit -f 4
  exec "$moecore" train-tokenizer --input "$D/corpus.txt" --vocab-size 500 --output "$D/tok"
) >"$D/tokfull.log" 2>&1 && fail "train-tokenizer on a full disk went unnoticed"
grep -q "cannot write $D/tok/tokenizer.json.tmp: File too large" "$D/tokfull.log" ||
  fail "tokenizer full disk: $(tail -3 "$D/tokfull.log")"
[ "$(sums "$D/tok")" = "$before" ] || fail "a failed train-tokenizer changed the earlier tokenizer"
echo "full disk in train-tokenizer: ended naming the file; the earlier tokenizer intact"
# 8. A Megatron torch_dist checkpoint.
M="$D/megatron/iter_0000010"
mkdir -p "$M"
echo '{"sharded_backend": "torch_dist", "sharded_backend_version": 1}' >"$M/metadata.json"
touch "$M/.metadata" "$M/common.pt" "$M/__0_0.distcp"
echo 10 >"$D/megatron/latest_checkpointed_iteration.txt"
before=$(sums "$D/megatron")
train --train-iters 12 --ckpt-format torch_dist --load "$D/megatron" --save "$D/megatron" >"$D/megatron.log" 2>&1 &&
  fail "loaded a Megatron checkpoint"
grep -q -- "--load $D/megatron holds a Megatron-LM torch_dist checkpoint (iter_0000010/ with metadata.json, .metadata, common.pt, 1 .distcp file), not a moecore checkpoint" \
  "$D/megatron.log" || fail "Megatron checkpoint: $(tail -3 "$D/megatron.log")"
grep -q "moecore convert hf-to-native" "$D/megatron.log" || fail "Megatron checkpoint: no way over named"
grep -q "iteration .*/" "$D/megatron.log" && fail "the refused run trained"
[ "$(sums "$D/megatron")" = "$before" ] || fail "a refused run changed the Megatron checkpoint"
echo "Megatron torch_dist checkpoint: refused naming its format and files"
# 9. --verify-integrity.
train --train-iters 2 --save "$D/vi" --verify-integrity --ckpt-format torch_dist >"$D/vi.log" 2>&1 ||
  fail "--verify-integrity save: $(tail -3 "$D/vi.log")"
[ -f "$D/vi/iter_0000002/integrity.json" ] || fail "--verify-integrity wrote no integrity.json"
listed=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['files']))" "$D/vi/iter_0000002/integrity.json")
[ "$listed" = "$(find "$D/vi/iter_0000002" -type f ! -name integrity.json | wc -l)" ] ||
  fail "integrity.json lists $listed files, not every other file of the checkpoint"
train --train-iters 4 --load "$D/vi" --save "$D/vi" --verify-integrity >"$D/vi2.log" 2>&1 ||
  fail "--verify-integrity load of an intact checkpoint: $(tail -3 "$D/vi2.log")"
grep -q "loaded checkpoint $D/vi/iter_0000002: iteration 2" "$D/vi2.log" || fail "--verify-integrity did not resume"
shard=$(cd "$D/vi/iter_0000004" && find . -type f ! -name '*.json' | sort | head -1 | sed 's|^\./||')
python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(-1,2); b=f.read(1); f.seek(-1,2); f.write(bytes([b[0]^1]))" \
  "$D/vi/iter_0000004/$shard"
train --train-iters 6 --load "$D/vi" --save "$D/vi" --verify-integrity >"$D/vi3.log" 2>&1 &&
  fail "--verify-integrity loaded a changed checkpoint"
grep -q -- "--verify-integrity: checkpoint integrity verification failed for 1 file(s) in $D/vi/iter_0000004: $shard: hash mismatch" \
  "$D/vi3.log" || fail "changed shard: $(tail -3 "$D/vi3.log")"
grep -q "iteration .*/" "$D/vi3.log" && fail "the refused run trained"
train --train-iters 2 --save "$D/nv" >"$D/nv.log" 2>&1 || fail "save without --verify-integrity: $(tail -3 "$D/nv.log")"
train --train-iters 4 --load "$D/nv" --save "$D/nv" --verify-integrity >"$D/vi4.log" 2>&1 &&
  fail "--verify-integrity loaded a checkpoint saved without it"
grep -q -- "--verify-integrity: integrity manifest not found at $D/nv/iter_0000002/integrity.json" "$D/vi4.log" ||
  fail "no manifest: $(tail -3 "$D/vi4.log")"
train --train-iters 2 --verify-integrity --ckpt-format torch_dcp >"$D/vi5.log" 2>&1 && fail "torch_dcp accepted"
grep -q "only supported with torch_dist checkpoint format" "$D/vi5.log" || fail "torch_dcp: $(tail -3 "$D/vi5.log")"
echo "--verify-integrity: manifest written, intact checkpoint resumed, a changed shard and a missing manifest refused"
echo "checkpoint guards: all checks passed"
