#!/usr/bin/env python3
"""Summarise bench/k8s_vs_local.sh's CSV: per configuration, each backend's wall time and the
ratio to local taken pair by pair (same repetition), as median [min-max].

  python3 bench/k8s_vs_local_summary.py bench/results/k8s-vs-local-DATE.csv

A run stopped by the benchmark's timeout counts with its wall time scaled to the full run
(wall / iterations x expected), marked with ``>``: a lower bound.
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict


def full_wall(row: dict[str, str]) -> tuple[float, bool] | None:
    """The run's wall time, scaled to the full run when it was stopped early."""
    wall, its, expected = float(row["wall_s"]), int(row["iterations"]), int(row["expected"])
    if row["status"] == "completed":
        return wall, False
    if its <= 0:
        return None
    return wall / its * expected, True


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(path: str) -> int:
    runs: dict[tuple[str, str, str], dict[str, dict[str, tuple[float, bool]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    modes: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    with open(path) as fh:
        for row in csv.DictReader(fh):
            key = (row["case"], row["ranks"], row["wait"])
            found = full_wall(row)
            if found is not None:
                runs[key][row["backend"]][row["rep"]] = found
            modes[(*key, row["backend"])].add(row["modes"])
    print(
        "| case | ranks | wait | backend | modes | wall s, median [min-max] | / local, pairwise |"
    )
    print("|---|---|---|---|---|---|---|")
    for key in sorted(runs):
        local = runs[key].get("local", {})
        for backend in ("local", "kubernetes", "local-tcp"):
            got = runs[key].get(backend)
            if not got:
                continue
            walls = [w for w, _ in got.values()]
            lower = ">" if any(stopped for _, stopped in got.values()) else ""
            ratios = [got[r][0] / local[r][0] for r in got if r in local]
            ratio = f"{lower}{spread(ratios)}" if backend != "local" and ratios else ""
            m = ",".join(sorted(modes[(*key, backend)]))
            print(f"| {key[0]} | {key[1]} | {key[2]} | {backend} | {m} | {lower}{spread(walls)}"
                  f" | {ratio} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
