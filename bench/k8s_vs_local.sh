#!/usr/bin/env bash
# Wall time of the same 4-rank pitzDaily run on the Kubernetes backend (dev cluster) and the
# local backend, interleaved, REPS times. Prints one line per run and the ratio per pair.
# Usage: bash bench/k8s_vs_local.sh [REPS] [ITERATIONS]   (root; brings the dev cluster up)
set -euo pipefail
reps=${1:-3}; its=${2:-60}
rp=${RANKPACK:-.venv/bin/rankpack}
export RANKPACK_HOME="${RANKPACK_HOME:-$(mktemp -d)}"
export RANKPACK_DB="${RANKPACK_DB:-$RANKPACK_HOME/bench.db}"
"$rp" dev-cluster up >/dev/null
sa=$("$rp" dev-cluster status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["service_account_kubeconfig"])')
wall() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["status"], round(d["wall_s"],2))'; }
for i in $(seq "$reps"); do
  l=$("$rp" run pitzDaily --ranks 4 --budget 2 --iterations "$its" --json | wall)
  k=$("$rp" run pitzDaily --ranks 4 --budget 2 --iterations "$its" --json --backend kubernetes \
        --kubeconfig "$sa" --allocatable 2 | wall)
  echo "rep $i local: $l  kubernetes: $k  ratio k8s/local: $(python3 -c "print(round(${k#* }/${l#* },2))")"
done
"$rp" dev-cluster down >/dev/null
