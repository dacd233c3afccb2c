#!/usr/bin/env bash
# Launched by mpirun on every rank: rank 1 is killed (SIGKILL) two seconds into a long training run. The test
# around it checks that the job ends within its timeout with a message naming the dead rank, instead of rank 0
# waiting forever in a collective. Usage: rank_dies.sh MOECORE_BIN TRAIN_ARGS...
moecore="$1"
shift
if [ "${OMPI_COMM_WORLD_RANK:-0}" = "1" ]; then
  (sleep 2 && kill -9 $$) &
fi
exec "$moecore" train "$@"
