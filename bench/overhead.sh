#!/bin/sh
# Per-call overhead of the PMPI shim: the microbenchmark with and without LD_PRELOAD,
# interleaved, REPS times per MPI flavour (1 rank, cheap calls on MPI_COMM_SELF).
#   make -C shim && bench/overhead.sh [REPS] [CALLS]
set -eu
cd "$(dirname "$0")/../shim"
reps=${1:-5}; n=${2:-2000000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RANKPACK_SHIM_DIR=/tmp/rankpack-overhead
echo "flavour,shim,function,calls,ns_per_call"
for i in $(seq "$reps"); do
  for f in openmpi mpich; do
    lib=$PWD/build/librankpack_pmpi.$f.so
    if [ $f = openmpi ]; then
      mpirun.openmpi -np 1 build/$f/overhead "$n" | sed 1d | sed "s/^/$f,no,/"
      mpirun.openmpi -np 1 -x LD_PRELOAD="$lib" -x RANKPACK_SHIM_DIR build/$f/overhead "$n" | sed 1d | sed "s/^/$f,yes,/"
    else
      mpirun.mpich -np 1 build/$f/overhead "$n" | sed 1d | sed "s/^/$f,no,/"
      mpirun.mpich -np 1 -genv LD_PRELOAD "$lib" -genv RANKPACK_SHIM_DIR "$RANKPACK_SHIM_DIR" build/$f/overhead "$n" | sed 1d | sed "s/^/$f,yes,/"
    fi
  done
done
