#!/usr/bin/env bash
# Names the host-synchronisation call sites that `moecore bench train --device cuda` prints as "BINARY+0xOFFSET"
# frames (cuda/gpu_profile.h): run here, on the unstripped binary the GPU machine's stripped copy was made from
# (scripts/gpu-pack.sh strips; the offsets are the same). Usage: scripts/symbolize-sync-sites.sh BENCH_OUTPUT BINARY
set -euo pipefail
OUT=${1:?usage: scripts/symbolize-sync-sites.sh BENCH_OUTPUT BINARY}
BIN=${2:?usage: scripts/symbolize-sync-sites.sh BENCH_OUTPUT BINARY}
name=$(basename "$BIN")
# Each site line: its count and kind, then its frames (innermost first), one function per frame.
grep -E "/step .* in [a-z]+: " "$OUT" | while IFS= read -r line; do
  echo "${line%%: *}"
  grep -oE "${name}\+0x[0-9a-f]+" <<<"$line" | sed "s/^${name}+//" | xargs -r addr2line -C -f -e "$BIN" |
    paste - - | awk -F'\t' '{ printf "      %s\n", $1 }'
done
