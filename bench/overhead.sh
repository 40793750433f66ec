#!/bin/sh
# Per-call overhead of the PMPI shim: the microbenchmark without the shim and with it,
# interleaved, REPS times per MPI flavour (1 rank, cheap calls on MPI_COMM_SELF).
#   make -C shim && bench/overhead.sh [REPS] [CALLS] [BEFORE_DIR]
# BEFORE_DIR (optional): a directory with another build of the libraries
# (librankpack_pmpi.<flavour>.so, e.g. the previous commit's shim/build), run in the same
# rounds and labelled "before", for side-by-side comparisons.
set -eu
cd "$(dirname "$0")/../shim"
reps=${1:-5}; n=${2:-2000000}; before=${3:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RANKPACK_SHIM_DIR=/tmp/rankpack-overhead
echo "flavour,shim,function,calls,ns_per_call"
run() { # flavour label lib
  if [ "$1" = openmpi ]; then
    if [ -z "$3" ]; then mpirun.openmpi -np 1 build/$1/overhead "$n"
    else mpirun.openmpi -np 1 -x LD_PRELOAD="$3" -x RANKPACK_SHIM_DIR build/$1/overhead "$n"; fi
  else
    if [ -z "$3" ]; then mpirun.mpich -np 1 build/$1/overhead "$n"
    else mpirun.mpich -np 1 -genv LD_PRELOAD "$3" -genv RANKPACK_SHIM_DIR "$RANKPACK_SHIM_DIR" build/$1/overhead "$n"; fi
  fi | sed 1d | sed "s/^/$1,$2,/"
}
for i in $(seq "$reps"); do
  for f in openmpi mpich; do
    run $f no ""
    run $f yes "$PWD/build/librankpack_pmpi.$f.so"
    if [ -n "$before" ]; then run $f before "$before/librankpack_pmpi.$f.so"; fi
  done
done
