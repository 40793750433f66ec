#!/bin/bash
# Issue 13: single-run penalty of `--wait auto` against `--wait spin`. Alternates the two
# modes (order swapped every repetition), each `rankpack run` in a fresh database, on
# 4-rank pitzDaily (the demo's case, 200 iterations) and the scaled pitzDaily weighted 1:3
# (150 iterations). Prints "rep workload mode wall_s" lines.
#   bash bench/wait_penalty.sh SCALED_CASE_DIR [REPS]
# SCALED_CASE_DIR: from `python3 bench/scaled_pitzdaily.py DIR`.
set -euo pipefail
scaled=$1
reps=${2:-6}
R="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/rankpack"
for rep in $(seq 1 "$reps"); do
  for w in pitzDaily scaled; do
    if [ $((rep % 2)) = 1 ]; then modes="spin auto"; else modes="auto spin"; fi
    for mode in $modes; do
      home=$(mktemp -d /tmp/rankpack-penalty-XXXX)
      if [ "$w" = pitzDaily ]; then
        args=(pitzDaily --ranks 4 --iterations 200)
      else
        args=("$scaled" --ranks 2 --weights 1,3 --decompose weighted --iterations 150)
      fi
      wall=$(RANKPACK_HOME=$home RANKPACK_DB=$home/db.sqlite "$R" run "${args[@]}" --wait "$mode" --json |
        python3 -c "import json,sys; print(json.load(sys.stdin)['wall_s'])")
      echo "$rep $w $mode $wall"
      rm -rf "$home"
    done
  done
done
