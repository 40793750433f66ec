#!/usr/bin/env python3
"""What crossing nodes costs: the same runs on a 1-node x 2-core and a 2-node x 1-core dev
cluster, side by side (issue 28 item 5).

  .venv/bin/python bench/nodes.py [--reps 3] [--iterations 60] [--scale 2] [--json OUT]

For each repetition the two shapes alternate (which goes first alternates too); on each
shape the dev cluster is brought up fresh (`dev-cluster up --nodes N`) and runs, on the
Kubernetes backend:

* **single**: one 4-rank simulation (weights 1,1,3,3, budget 1.6 cores: on 2 nodes of one
  core it cannot sit on one node, so its ranks talk over the pod network between nodes),
  the issue's phases ``0:200,200,600,600;0.5:400,400,400,400`` (4 resizes in place);
* **pair**: two 2-rank simulations at once (budget 0.8 each, ``0:200,600;0.5:600,200``),
  the co-located pair.

It reports, per shape, the single run's wall time, the pair's makespan, and the in-place
resize latency (p50/p95 over every resize of every run); and, repetition by repetition,
the ratios 2x1 / 1x2 (median and spread). Needs root and the k8s binaries (`setup.sh`);
takes down a dev cluster that is up and leaves none up. The case: pitzDaily scaled
``--scale`` times in x and y (2: 48 900 cells, ~12 000 per rank at 4 ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES = (1, 2)


def rankpack(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankpack", *args], capture_output=True,
                          text=True, timeout=timeout_s, check=False)  # fmt: skip


def up(nodes: int) -> None:
    rankpack("dev-cluster", "down")
    done = rankpack("dev-cluster", "up", "--nodes", str(nodes), "--json")
    if done.returncode != 0:
        raise SystemExit(f"dev-cluster up --nodes {nodes} failed: {done.stderr.strip()[-300:]}")


SINGLE_PHASES = "0:200,200,600,600;0.5:400,400,400,400"
"""The issue's phase schedule: half way every rank is resized in place (4 resizes a run)."""
PAIR_PHASES = "0:200,600;0.5:600,200"


def run_args(
    case: Path, ranks: int, weights: str, budget: str, iterations: int, phases: str
) -> list[str]:
    return ["run", str(case), "--backend", "kubernetes", "--ranks", str(ranks), "--weights",
            weights, "--budget", budget, "--iterations", str(iterations), "--phases", phases,
            "--json"]  # fmt: skip


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=900)
    try:
        data: dict[str, Any] = json.loads(out)
    except ValueError:
        raise SystemExit(f"a run printed no JSON: {err.strip()[-300:]}") from None
    if data.get("status") != "completed":
        raise SystemExit(f"a run ended {data.get('status')}: {data.get('message')}")
    return data


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rankpack", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def latencies(runs: list[dict[str, Any]]) -> list[float]:
    return [float(r["latency_s"]) for d in runs for r in d.get("resizes", [])
            if r.get("status") == "completed" and r.get("latency_s") is not None]  # fmt: skip


def one_shape(nodes: int, case: Path, iterations: int, env: dict[str, str]) -> dict[str, Any]:
    up(nodes)
    single = result(start(run_args(case, 4, "1,1,3,3", "1.6", iterations, SINGLE_PHASES), env))
    t0 = time.monotonic()
    pair_args = run_args(case, 2, "1,1", "0.8", iterations, PAIR_PHASES)
    pair_procs = [start(pair_args, env) for _ in range(2)]
    pair = [result(p) for p in pair_procs]
    makespan = time.monotonic() - t0
    spread = sorted({r["node"] for r in single["ranks"]})
    return {
        "nodes": nodes,
        "single_wall_s": single["wall_s"],
        "single_nodes": spread,
        "pair_makespan_s": makespan,
        "pair_walls_s": [d["wall_s"] for d in pair],
        "resize_latencies_s": latencies([single, *pair]),
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--scale", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rankpack-nodes-bench.", dir="/var/tmp"))
    env = {**os.environ, "RANKPACK_HOME": str(work / "home"), "RANKPACK_DB": str(work / "db"),
           "KUBECONFIG": "/var/lib/rankpack/dev-cluster/rankpack-sa.kubeconfig"}  # fmt: skip
    case = work / "case"
    subprocess.run([sys.executable, str(ROOT / "bench" / "scaled_pitzdaily.py"), str(case),
                    "--scale", str(args.scale)], check=True)  # fmt: skip
    reps: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            order = SHAPES if rep % 2 == 0 else tuple(reversed(SHAPES))
            shapes = {n: one_shape(n, case, args.iterations, env) for n in order}
            reps.append(
                {"rep": rep, "order": list(order), **{f"{n}x": s for n, s in shapes.items()}}
            )
            print(json.dumps(reps[-1]), flush=True)
    finally:
        rankpack("dev-cluster", "down")
    summary: dict[str, Any] = {"command": " ".join(sys.argv), "reps": reps}
    for key in ("single_wall_s", "pair_makespan_s"):
        ratios = [r["2x"][key] / r["1x"][key] for r in reps]
        summary[f"{key}_ratio_2x1_over_1x2"] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        }
    for n in SHAPES:
        lat = [v for r in reps for v in r[f"{n}x"]["resize_latencies_s"]]
        summary[f"resize_latency_{n}_nodes"] = {"n": len(lat), "p50_s": pct(lat, 0.5),
                                               "p95_s": pct(lat, 0.95)}  # fmt: skip
    print(json.dumps({k: v for k, v in summary.items() if k != "reps"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
