#!/usr/bin/env bash
# rankpack set-up for Debian 12 (run as root). Installs everything rankpack needs, then
#   bash setup.sh demo   runs the main job: `rankpack demo` (pitzDaily x4 cells, local
#                        backend: the limits hazard, duty cycles, the co-location gain;
#                        ends with a summary and the path of an HTML report)
#   bash setup.sh test   runs the full test suite (lint, types, layers, unit, contract,
#                        integration and the k8s tier on a real single-node cluster;
#                        the first run builds Kubernetes)
# Safe to run again: installed packages are skipped, the virtualenv is reused.
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-}"
case "$mode" in
  demo | test) ;;
  *) echo "usage: bash setup.sh demo|test" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages and rankpack creates cgroups)" >&2
  exit 2
fi

# OpenFOAM v1912 + its tutorials, Open MPI (what OpenFOAM uses), MPICH (the shim is also
# built and tested against it), a C toolchain for the PMPI shim, Python with venv.
# The dev cluster (`rankpack dev-cluster`, the k8s test tier): containerd, runc, the CNI
# plugins, etcd, a static busybox and umoci for the locally built images.
packages=(openfoam openfoam-examples openmpi-bin libopenmpi-dev mpich libmpich-dev
  build-essential make python3 python3-venv python3-dev
  containerd runc containernetworking-plugins etcd-server busybox-static umoci)
# The test mode opens the HTML report in headless Chromium (tests/browser.py) and builds
# rankpack's container images with mmdebstrap (rankpack.devcluster.appimages).
if [ "$mode" = test ]; then
  packages+=(chromium mmdebstrap)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # etcd's and containerd's install scripts would start them as services; a policy-rc.d
  # that exits 101 forbids that for the install (ours only: an existing one is kept).
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  for attempt in 1 2 3 4 5 6; do  # another apt may hold the lock for a while
    if apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; then
      break
    fi
    [ "$attempt" -lt 6 ] || exit 1
    echo "setup.sh: apt failed (locked?), retrying in 20 s" >&2
    sleep 20
  done
  if [ -n "$own_policy" ]; then
    rm -f /usr/sbin/policy-rc.d
    trap - EXIT
  fi
fi

python="${RANKPACK_PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "$mode" = test ]; then
  .venv/bin/python -m pip install -q -e ".[test]"
else
  .venv/bin/python -m pip install -q -e .
fi

# The PMPI shim (C), built for Open MPI and MPICH and installed into the package.
if [ -f shim/Makefile ]; then
  make -s -C shim install
fi

case "$mode" in
  demo)
    exec .venv/bin/rankpack demo
    ;;
  test)
    .venv/bin/ruff check src tests
    .venv/bin/ruff format --check src tests
    .venv/bin/mypy
    .venv/bin/lint-imports
    # The k8s tier's cluster: build the Kubernetes binaries from the Go module proxy once
    # (about 10 minutes on 2 cores; cached by version under /var/cache/rankpack, fetching a
    # Go toolchain from the proxy too if this machine has none new enough).
    .venv/bin/python -m rankpack.devcluster.binaries
    # rankpack-tools (tools/, Go, static): what runs inside a Simulation's own image.
    .venv/bin/python -m rankpack.devcluster.toolsbuild
    # rankpack's container images (rankpack, rank) for the in-cluster tests: each Debian
    # base once per package list (a few minutes; cached under /var/cache/rankpack/images),
    # rankpack's code layer once per source change (seconds).
    .venv/bin/python -m rankpack.devcluster.appimages
    # The peer tier: mpi4py built from its sdist against Open MPI and MPICH (a few minutes,
    # once; cached by version under /var/cache/rankpack/mpi4py). MPICH with 4 ranks runs a
    # subset here: its whole suite (over 40 min a run on 2 cores) is `peer_slow`, for
    # machines with a core per rank: pytest -m peer_slow tests/peer.
    bash tests/peer/install_mpi4py.sh .venv/bin/python openmpi mpich
    # promtool for deploy/monitoring's rules: Debian's prometheus package unpacked (not
    # installed: no daemon), cached by version under /var/cache/rankpack/promtool.
    sh tests/monitoring/install_promtool.sh >/dev/null
    # The slowest tests are listed at the end (where a CI run spends its time). `k8s_slow`
    # (a lost node under the in-cluster operator, ~15 min) runs apart: pytest -m k8s_slow tests/k8s
    exec .venv/bin/python -m pytest -q -p no:cacheprovider -m "not peer_slow and not k8s_slow" --durations=30
    ;;
esac
