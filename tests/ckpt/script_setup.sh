# Sourced by the checkpoint test scripts, called as SCRIPT MOECORE MPIRUN [MPIRUN ARGS...]: sets $moecore, the
# mpirun command line in ${mpirun[@]}, a scratch directory $D removed on exit, and fail MESSAGE.
set -u
moecore=$1
shift
mpirun=("$@")
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
