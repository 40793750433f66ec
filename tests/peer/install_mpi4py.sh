#!/usr/bin/env bash
# Builds mpi4py from its PyPI sdist against the system Open MPI and MPICH, once, for the peer
# test tier (tests/peer/). Called by setup.sh; safe to run again (a complete build is reused).
#   bash tests/peer/install_mpi4py.sh PYTHON [FLAVOUR...]
# Result, outside the checkout (RANKPACK_PEER_CACHE, default /var/cache/rankpack/mpi4py):
#   <cache>/<version>-src/test/          the sdist's own test suite (flavour-independent)
#   <cache>/<version>-<flavour>/site/    mpi4py built with mpicc.<flavour> (put on PYTHONPATH)
#   <cache>/<version>-<flavour>/.complete   marker written last: a partial build is redone
set -euo pipefail
python="${1:?usage: install_mpi4py.sh PYTHON [FLAVOUR...]}"
shift
flavours=("$@")
[ "${#flavours[@]}" -gt 0 ] || flavours=(openmpi mpich)
version="${RANKPACK_MPI4PY_VERSION:-4.1.2}"
cache="${RANKPACK_PEER_CACHE:-/var/cache/rankpack/mpi4py}"
mkdir -p "$cache"
# One build at a time (setup.sh and a pytest fixture may both ask for it).
exec 9>"$cache/.lock"
flock 9

src="$cache/$version-src"
if [ ! -f "$src/.complete" ]; then
  rm -rf "$src" "$src.tmp"
  mkdir -p "$src.tmp"
  "$python" -m pip download -q --no-binary :all: --no-deps -d "$src.tmp" "mpi4py==$version"
  tar -xzf "$src.tmp/mpi4py-$version.tar.gz" -C "$src.tmp"
  mv "$src.tmp/mpi4py-$version.tar.gz" "$src.tmp/mpi4py-$version/"
  mv "$src.tmp/mpi4py-$version" "$src"
  rm -rf "$src.tmp"
  touch "$src/.complete"
fi

for flavour in "${flavours[@]}"; do
  dest="$cache/$version-$flavour"
  [ -f "$dest/.complete" ] && continue
  echo "install_mpi4py: building mpi4py $version against $flavour (a few minutes, once)"
  rm -rf "$dest"
  mkdir -p "$dest"
  MPICC="mpicc.$flavour" "$python" -m pip install -q --no-deps --no-cache-dir \
    --target "$dest/site" "$src/mpi4py-$version.tar.gz"
  # The build must really use this flavour's library. (ldd's output is taken whole first: a
  # `grep -q` on a pipe may close it early, and pipefail would count ldd's SIGPIPE a failure.)
  libs=$(ldd "$dest"/site/mpi4py/MPI*.so)
  grep -q "$( [ "$flavour" = openmpi ] && echo libmpi.so || echo libmpich.so )" <<<"$libs" || {
    echo "install_mpi4py: $dest is not linked against $flavour" >&2
    exit 1
  }
  touch "$dest/.complete"
done
