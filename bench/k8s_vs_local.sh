#!/usr/bin/env bash
# Wall time of the same run on the local backend and on the Kubernetes backend (dev cluster),
# side by side: for each configuration the backends alternate, REPS times, and the ratio
# Kubernetes/local is taken pair by pair (issue 24). Also local over TCP (`btl self,tcp`, the
# transport rank pods use) against local with its default shared-memory transport.
#
# Usage: bash bench/k8s_vs_local.sh [REPS] [CASES] [WAITS] [RANKS]   (root)
#   CASES  comma list of: pitzDaily (12 225 cells, 60 iterations),
#          user (pitzDaily x3 in x and y: 110 025 cells, ~27 500 per rank at 4 ranks,
#          100 iterations)                                       default: pitzDaily,user
#   WAITS  comma list of: auto (the default), spin, polite       default: auto,polite,spin
#   RANKS  comma list of 2, 4 (4: weights 1,1,5,15; both budget 2)  default: 2,4
# Environment: RANKPACK (the CLI), BENCH_TIMEOUT_S (per run, default 240: a run stopped there
# counts with its time per iteration scaled to the full run), BENCH_OUT (CSV path).
# Brings the dev cluster up if it is not, and leaves it as it found it.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
IFS=, read -r -a cases <<<"${2:-pitzDaily,user}"
IFS=, read -r -a waits <<<"${3:-auto,polite,spin}"
IFS=, read -r -a rank_counts <<<"${4:-2,4}"
rp=${RANKPACK:-.venv/bin/rankpack}
timeout_s=${BENCH_TIMEOUT_S:-240}
out=${BENCH_OUT:-bench/results/k8s-vs-local-$(date +%F).csv}
work=$(mktemp -d /var/tmp/rankpack-bench.XXXXXX)
export RANKPACK_HOME="$work/home"
export RANKPACK_DB="$work/bench.db"

was_up=1
"$rp" dev-cluster status --json >/dev/null 2>&1 || was_up=0
[ "$was_up" = 1 ] || "$rp" dev-cluster up >/dev/null
cleanup() {
  [ "$was_up" = 1 ] || "$rp" dev-cluster down >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
sa=$("$rp" dev-cluster status --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["service_account_kubeconfig"])')

case_dir() {  # name -> case argument
  case "$1" in
    pitzDaily) echo pitzDaily ;;
    user)
      [ -d "$work/pitzDaily-x3" ] || python3 bench/scaled_pitzdaily.py "$work/pitzDaily-x3" --scale 3 >&2
      echo "$work/pitzDaily-x3" ;;
    *) echo "unknown case $1 (pitzDaily, user)" >&2; exit 2 ;;
  esac
}
iterations() { [ "$1" = user ] && echo 100 || echo 60; }
weights() { [ "$1" = 4 ] && echo 1,1,5,15 || echo 1,1; }

one() {  # backend case ranks wait -> "status wall_s iterations modes"
  local backend=$1 name=$2 ranks=$3 wait=$4 extra=()
  local its; its=$(iterations "$name")
  case "$backend" in
    kubernetes) extra=(--backend kubernetes --kubeconfig "$sa" --allocatable 2) ;;
    local-tcp) export OMPI_MCA_btl=self,tcp ;;
  esac
  timeout -s TERM -k 30 "$timeout_s" "$rp" run "$(case_dir "$name")" --ranks "$ranks" \
    --weights "$(weights "$ranks")" --budget 2 --iterations "$its" --wait "$wait" \
    --json "${extra[@]}" 2>/dev/null |
    python3 -c '
import json, sys
text = sys.stdin.read()
try:
    d = json.loads(text)
except ValueError:
    print("error 0 0 -"); sys.exit()
modes = "/".join(sorted({w["mode"] for w in d.get("wait_modes", [])})) or "-"
print(d["status"], round(d["wall_s"], 2), d["iterations"], modes)' || true
  unset OMPI_MCA_btl
}

[ -s "$out" ] || echo "case,ranks,wait,rep,backend,status,wall_s,iterations,expected,modes" >"$out"
for name in "${cases[@]}"; do
  for ranks in "${rank_counts[@]}"; do
    for wait in "${waits[@]}"; do
      backends=(local kubernetes)
      [ "$wait" = auto ] && backends+=(local-tcp)
      for rep in $(seq "$reps"); do
        for backend in "${backends[@]}"; do
          read -r status wall its modes <<<"$(one "$backend" "$name" "$ranks" "$wait")"
          line="$name,$ranks,$wait,$rep,$backend,$status,$wall,$its,$(iterations "$name"),$modes"
          echo "$line" | tee -a "$out"
        done
      done
    done
  done
done
python3 bench/k8s_vs_local_summary.py "$out"
