#!/usr/bin/env python3
"""Throughput gain of `rankpack multiplex` for N = 1..3 pitzDaily simulations, spin vs polite.

Each repetition runs every (wait mode, N) configuration once, in a rotated order, each in a
fresh database so the single-run baseline (`--baseline auto`: one run alone, same settings,
same wait mode) is measured in the same session as the multiplexed runs. Reports median
and min-max of the throughput gain (sequential time / makespan), the makespan and the
fairness ratio.

  .venv/bin/python bench/multiplex_bench.py --reps 3 --iterations 280 --max-n 3 --profile-s 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

RANKPACK = [str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "rankpack")]


def one(wait: str, n: int, iterations: int, budget: float, profile_s: float) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix=f"mux-{wait}-{n}-"))
    env = {**os.environ, "RANKPACK_HOME": str(home), "RANKPACK_DB": str(home / "db.sqlite")}
    subprocess.run(
        [*RANKPACK, "submit", "pitzDaily", "--ranks", "4", "--budget", str(budget),
         "--iterations", str(iterations), "--count", str(n)],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    out = subprocess.run(
        [*RANKPACK, "multiplex", "--max-concurrent", str(n), "--wait", wait,
         "--profile-s", str(profile_s), "--json"],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    data = json.loads(out.stdout)
    return {
        "gain": data["throughput_gain"],
        "makespan_s": data["makespan_s"],
        "sequential_s": data["sequential_s"],
        "fairness": data["fairness_ratio"] or 1.0,
        "resizes": data["resizes"],
        "restarts": data["restarts"],
        "max_seen": data["max_concurrent_seen"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--max-n", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1.0, help="cores of requests per simulation")
    ap.add_argument("--waits", default="spin,polite")
    ap.add_argument("--profile-s", type=float, default=2.0)
    args = ap.parse_args()
    configs = [(w, n) for w in args.waits.split(",") for n in range(1, args.max_n + 1)]
    results: dict[tuple[str, int], list[dict[str, float]]] = {c: [] for c in configs}
    print("rep,wait,n,gain,makespan_s,sequential_s,fairness,resizes,restarts,max_concurrent_seen")
    for rep in range(args.reps):
        k = rep % len(configs)
        for wait, n in configs[k:] + configs[:k]:
            r = one(wait, n, args.iterations, args.budget, args.profile_s)
            results[(wait, n)].append(r)
            print(f"{rep},{wait},{n},{r['gain']:.3f},{r['makespan_s']:.2f},"
                  f"{r['sequential_s']:.2f},{r['fairness']:.2f},{r['resizes']},{r['restarts']},"
                  f"{r['max_seen']}", flush=True)  # fmt: skip
    print()
    print(
        "| wait | N | runs | throughput gain | makespan s | fairness (max/min wall) | resizes"
        " | restarts |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (wait, n), rs in results.items():

        def stat(key: str, rs: list[dict[str, float]] = rs) -> str:
            v = [r[key] for r in rs]
            return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

        print(f"| {wait} | {n} | {len(rs)} | {stat('gain')} | {stat('makespan_s')} | "
              f"{stat('fairness')} | {statistics.median(r['resizes'] for r in rs):.0f} | "
              f"{max(r['restarts'] for r in rs):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
