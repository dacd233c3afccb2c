#!/usr/bin/env bash
# The main job from a fresh clone: install dependencies, build, and run what moecore does today.
# Today that is the machine's roofline (GEMM) and the attention kernel against it; the MoE training demo on the
# fortunes corpus replaces this once `moecore train` lands (issue "Train end to end").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOECORE_BUILD_TESTS=OFF
cmake --build build -j"$(nproc)" --target moecore
./build/moecore --version
./build/moecore bench gemm
./build/moecore bench attention
