#!/usr/bin/env bash
# The house rules a machine can check, run by CTest (style_check): every C++ and CUDA file under src/ and tests/
# (.cpp, .h, .cu, .cuh, .inc) is clang-format clean with the repo's .clang-format, no line is over 120 columns, and
# no source file is over 600 lines. Prints each offending file with what to run; exits 1 if any. Each check is one
# process over all the files (one clang-format per file took ten times as long).
set -uo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
exts=(cpp h cu cuh inc)
mapfile -t listed < <(git ls-files "${exts[@]/#/src/*.}" "${exts[@]/#/tests/*.}" 2>/dev/null ||
                      find src tests \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \))
files=()
for f in "${listed[@]}"; do [ -f "$f" ] && files+=("$f"); done
bad=0
if [ "${#files[@]}" -gt 0 ]; then
  if ! out=$("$CLANG_FORMAT" --style=file --dry-run -Werror "${files[@]}" 2>&1); then
    mapfile -t unformatted < <(sed -nE 's/^(.+):[0-9]+:[0-9]+: error: .*clang-format-violations.*/\1/p' <<<"$out" |
                                 sort -u)
    [ "${#unformatted[@]}" -gt 0 ] || echo "style: $CLANG_FORMAT failed: $(head -5 <<<"$out")"
    for f in "${unformatted[@]}"; do echo "style: $f is not clang-format clean (run: clang-format -i $f)"; done
    bad=1
  fi
  # characters, not bytes; each as FILE:LINE:the first columns
  long=$(LC_ALL=C.UTF-8 grep -nHP '^.{121,}' "${files[@]}" | awk -F: '{print $1 ":" substr($0, length($1) + 2, 60)}')
  if [ -n "$long" ]; then
    echo "style: lines over 120 columns:"
    echo "$long"
    bad=1
  fi
  while read -r n f; do
    if [ "$f" != total ] && [ "$n" -gt 600 ]; then
      echo "style: $f has $n lines (at most 600: split it by job)"
      bad=1
    fi
  done < <(wc -l "${files[@]}")
fi
if [ "$bad" -eq 0 ]; then
  echo "style: ${#files[@]} C++ and CUDA files clang-format clean, within 120 columns and 600 lines"
fi
exit "$bad"
