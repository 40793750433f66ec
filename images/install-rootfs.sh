#!/bin/sh
# Make a Debian 12 root filesystem into the BASE of a rankpack image: everything but
# rankpack's own code (which images/install-code.py adds on top, in a layer of its own).
#
#   sh install-rootfs.sh rankpack   Debian packages of packages/rankpack.txt, the user
#                                   rankpack (uid/gid 1000, home /home/rankpack) and the
#                                   venv /opt/rankpack: Debian's python3 with rankpack's
#                                   dependencies (pyproject.toml [project] dependencies)
#   sh install-rootfs.sh rank       then the packages of packages/rank.txt (OpenFOAM, MPI)
#
# Runs as root INSIDE the root filesystem, from a directory holding a copy of images/
# (this script, dpkg.cfg, packages/) and pyproject.toml. Both builds run it, so they
# cannot diverge:
#   - images/Containerfile: RUN on debian:bookworm-slim (apt-get installs the packages);
#   - rankpack.devcluster.appimages: chroot in mmdebstrap's customize hook (mmdebstrap has
#     installed the packages already, so the apt-get step finds nothing missing).
# Safe to run again. Needs the network: Debian's mirror (apt sources of the root
# filesystem) and PyPI (pip's default index, or what PIP_* variables name).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
  rankpack | rank) target=$1 ;;
  *) echo "usage: install-rootfs.sh rankpack|rank" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8

# dpkg's path filters first, so that packages installed from here on honour them.
install -m 0644 "$here/dpkg.cfg" /etc/dpkg/dpkg.cfg.d/rankpack

# 1. Debian packages (comments and blank lines in the list are ignored).
missing=""
for p in $(sed -e 's/#.*//' "$here/packages/$target.txt"); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing="$missing $p"
done
if [ -n "$missing" ]; then
  apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  apt-get install -y -qq --no-install-recommends $missing
  apt-get clean
  rm -rf /var/lib/apt/lists/*
fi

if [ "$target" = rankpack ]; then
  # 2. The user every container runs as: numeric 1000:1000 in the image config, so that
  #    Kubernetes can check runAsNonRoot.
  getent group rankpack >/dev/null || groupadd --gid 1000 rankpack
  getent passwd rankpack >/dev/null ||
    useradd --uid 1000 --gid 1000 --create-home --home-dir /home/rankpack \
      --shell /bin/bash rankpack

  # 3. The venv, owned by root (read-only to the rankpack user), with rankpack's
  #    third-party dependencies. rankpack itself is installed into it by install-code.py.
  [ -x /opt/rankpack/bin/python ] || python3 -m venv /opt/rankpack
  requirements=$(mktemp)
  python3 - "$here/pyproject.toml" >"$requirements" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
EOF
  /opt/rankpack/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
    --progress-bar off -q -r "$requirements"
  rm -f "$requirements"
  # What pip resolved, for the record (the dependency list has lower bounds only).
  /opt/rankpack/bin/python -m pip freeze --disable-pip-version-check --all \
    >/opt/rankpack/requirements.lock
fi
