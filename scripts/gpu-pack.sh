#!/usr/bin/env bash
# Packs moecore's built binaries with the runtime libraries a bare GPU machine lacks (oneDNN, Open MPI and its
# plugins, yaml-cpp, protobuf, ...) into one tarball, so a GPU machine that has the CUDA driver and toolkit but none
# of Debian's packages can run the GPU tests and benchmarks without building. glibc, the CUDA driver and cuBLAS are
# taken from the GPU machine. Usage: scripts/gpu-pack.sh BUILD_DIR OUT.tar.xz
# On the GPU machine: tar -xf OUT.tar.xz -C DIR && source DIR/env.sh, then scripts/gpu-test.sh OUTDIR --prebuilt DIR.
set -euo pipefail

BUILD=${1:?usage: scripts/gpu-pack.sh BUILD_DIR OUT.tar.xz}
TAR=${2:?usage: scripts/gpu-pack.sh BUILD_DIR OUT.tar.xz}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/ompi" "$STAGE/pmix"

bins=()
for b in moecore moecore_cuda_tests moecore_mpi_tests moecore_tests; do  # moecore_tests: the host and AMX checks
  [[ -x "$BUILD/$b" ]] && bins+=("$BUILD/$b")
done
for b in "${bins[@]}"; do strip -o "$STAGE/bin/$(basename "$b")" "$b"; done

ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
pmix_plugins=/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
cp -a "$ompi_plugins"/. "$STAGE/ompi/"
[[ -d "$pmix_plugins" ]] && cp -a "$pmix_plugins"/. "$STAGE/pmix/"
cp "$(readlink -f "$(command -v orterun)")" "$STAGE/bin/mpirun"
[[ -d /usr/share/openmpi ]] && cp -a /usr/share/openmpi "$STAGE/share-openmpi"

# Every shared library the binaries and plugins load, except the C and C++ runtimes, the CUDA driver, cuBLAS and NCCL
# (218 MB), which the GPU machine provides (its toolkit, or PyTorch's nvidia wheels) in versions matching its driver,
# and cuDNN (hundreds of MB; loaded with dlopen at run time from PyTorch's wheel on the GPU machine, see env.sh).
skip='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|linux-vdso|libcuda|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*|libnvidia|libstdc\+\+|libgcc_s)\.'
{
  for f in "${bins[@]}" "$STAGE/bin/mpirun" "$STAGE"/ompi/*.so "$STAGE"/pmix/*.so; do
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
  done
} | sort -u | while read -r lib; do
  name=$(basename "$lib")
  [[ "$name" =~ $skip ]] && continue
  cp -L "$lib" "$STAGE/lib/$name"
done

cat >"$STAGE/env.sh" <<'EOF'
# Sourced on the GPU machine: the packed libraries first, then the machine's CUDA libraries.
P=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
torch_cu=$(python3 -c 'import os, nvidia; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
extra=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib "$torch_cu"/nvidia/cu13/lib "$torch_cu"/nvidia/cublas/lib \
  "$torch_cu"/nvidia/cudnn/lib "$torch_cu"/nvidia/nccl/lib; do
  [[ -d "$d" ]] && extra="$extra:$d"
done
export LD_LIBRARY_PATH="$P/lib$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$P/bin:$PATH"
export OMPI_MCA_mca_base_component_path="$P/ompi"
export PMIX_MCA_mca_base_component_path="$P/pmix"
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[[ -d "$P/share-openmpi" ]] && export OPAL_PKGDATADIR="$P/share-openmpi"
[[ -d /usr/share/games/fortunes ]] || export FORTUNES_DIR="$P/fortunes"
EOF

# The fortunes (the top level of Debian's package: what `moecore corpus fortunes` reads), for the scripted GPU tests
# that make their corpus from them (tests/ckpt/generate_cuda.sh, tests/train/megatron_configs.py: FORTUNES_DIR).
mkdir -p "$STAGE/fortunes"
find /usr/share/games/fortunes -maxdepth 1 -type f -exec cp {} "$STAGE/fortunes/" \;

# The commit the binaries were built from (the GPU machine's copy of the tree may have no .git).
root="$(cd "$(dirname "$0")/.." && pwd)"
echo "$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null ||
  echo ' + uncommitted changes')" >"$STAGE/commit.txt"
tar -C "$STAGE" -cJf "$TAR" .
echo "gpu-pack: $(du -h "$TAR" | cut -f1) in $TAR ($(ls "$STAGE/lib" | wc -l) libraries, ${#bins[@]} binaries)"
