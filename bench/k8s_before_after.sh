#!/usr/bin/env bash
# The 4-rank weighted pitzDaily on the dev cluster at default sizing (weights 1,1,5,15,
# budget 2, 150 iterations, duty sizing, --wait auto), with two versions of rankpack's
# source, alternated pair by pair: a change that must leave the run's speed as it was.
# Usage (root, the dev cluster up, .venv built):
#   git worktree add --detach /work/wt-base REV   # the version to compare with
#   bash bench/k8s_before_after.sh REPS BEFORE_SRC AFTER_SRC OUT.csv
#   e.g. bash bench/k8s_before_after.sh 3 /work/wt-base/src src bench/results/x.csv
# (BEFORE_SRC needs the shim libraries: cp src/rankpack/_lib/*.so BEFORE_SRC/rankpack/_lib/)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}; before=$(realpath "$2"); after=$(realpath "$3"); out=$4
sa=/var/lib/rankpack/dev-cluster/rankpack-sa.kubeconfig
work=$(mktemp -d /var/tmp/rankpack-pair.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -s "$out" ] || echo "rep,version,status,wall_s,iterations" >"$out"
for rep in $(seq "$reps"); do
  for v in before after; do
    src=$before; [ "$v" = after ] && src=$after
    line=$(PYTHONPATH=$src RANKPACK_HOME="$work/home" RANKPACK_DB="$work/pair.db" \
      .venv/bin/python -m rankpack run pitzDaily --ranks 4 --weights 1,1,5,15 --budget 2 \
      --iterations 150 --backend kubernetes --kubeconfig "$sa" --allocatable 2 --json 2>/dev/null |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["status"], round(d["wall_s"],2), d["iterations"])' ||
      echo "error 0 0")
    read -r status wall its <<<"$line"
    echo "$rep,$v,$status,$wall,$its" | tee -a "$out"
  done
done
