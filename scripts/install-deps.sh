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
  libpcre2-dev libutf8proc-dev  # tokenizer pre-tokenizer regex and Unicode normalization
  libopenmpi-dev openmpi-bin    # distributed training
  fortunes             # the embedded default corpus of the demo
  clang-format
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
