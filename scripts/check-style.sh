#!/usr/bin/env bash
# The house rules a machine can check, run by CTest (style_check): every C++ and CUDA file under src/ and tests/
# (.cpp, .h, .cu, .cuh, .inc) is clang-format clean with the repo's .clang-format, no line is over 120 columns, and
# no source file is over 600 lines. Prints each offending file with what to run; exits 1 if any.
set -uo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
exts=(cpp h cu cuh inc)
mapfile -t files < <(git ls-files "${exts[@]/#/src/*.}" "${exts[@]/#/tests/*.}" 2>/dev/null ||
                     find src tests \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \))
bad=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "style: $f is not clang-format clean (run: clang-format -i $f)"
    bad=1
  fi
  long=$(LC_ALL=C.UTF-8 grep -nP '^.{121,}' "$f" | cut -c1-60 | sed "s|^|$f:|")  # characters, not bytes
  if [ -n "$long" ]; then
    echo "style: lines over 120 columns:"
    echo "$long"
    bad=1
  fi
  n=$(wc -l <"$f")
  if [ "$n" -gt 600 ]; then
    echo "style: $f has $n lines (at most 600: split it by job)"
    bad=1
  fi
done
if [ "$bad" -eq 0 ]; then
  echo "style: ${#files[@]} C++ and CUDA files clang-format clean, within 120 columns and 600 lines"
fi
exit "$bad"
