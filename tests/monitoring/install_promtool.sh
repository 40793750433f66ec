#!/bin/sh
# promtool, from Debian's prometheus package unpacked (not installed: no daemon, no user),
# cached by the package's version under $RANKPACK_CACHE/promtool (default
# /var/cache/rankpack/promtool). Prints promtool's path.
#   sh tests/monitoring/install_promtool.sh
set -eu
cache="${RANKPACK_CACHE:-/var/cache/rankpack}/promtool"
version=$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  echo "install_promtool: no prometheus package in the apt sources (apt-get update?)" >&2
  exit 2
fi
dest="$cache/$version"
if [ ! -x "$dest/usr/bin/promtool" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download -q prometheus >/dev/null)
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
  mkdir -p "$cache"
  rm -rf "$dest"
  mv "$tmp/root" "$dest"
fi
echo "$dest/usr/bin/promtool"
