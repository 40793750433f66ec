#!/usr/bin/env python3
"""Wait-mode benchmark of the PMPI shim on pitzDaily (4 ranks, Open MPI, this machine).

For every repetition and configuration (order rotated each repetition, so slow phases of a
shared machine hit every configuration alike) it times
  single:     one 4-rank simpleFoam run
  concurrent: two 4-rank runs started together (wall time until both end)
and reports, per configuration, medians and min-max over repetitions of
  penalty = single / single(spin)                 (same repetition)
  gain    = 2 x single(spin) / concurrent          (sequential spin runs vs this concurrent pair)
  gain_same = 2 x single / concurrent              (sequential vs concurrent, same mode)

  python3 bench/wait_modes.py --reps 3 --iterations 200 \
      --config noshim --config spin --config polite --config adaptive \
      --config 'yield:WAIT=polite,YIELD=1,SPIN_US=10'

A configuration is NAME or NAME:KEY=VALUE,... where keys are RANKPACK_SHIM_* suffixes;
NAME alone means RANKPACK_SHIM_WAIT=NAME, and `noshim` runs without the library. The key
LIB=PATH preloads another build of the library (e.g. the previous commit's, for a
before/after comparison in the same session).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "shim" / "build" / "librankpack_pmpi.openmpi.so"


def parse_config(text: str) -> tuple[str, dict[str, str] | None]:
    name, _, rest = text.partition(":")
    if name == "noshim":
        return name, None
    env = {"RANKPACK_SHIM_WAIT": name}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        env["LIB" if key == "LIB" else f"RANKPACK_SHIM_{key}"] = value
    return name, env


def launch(case: Path, shim: dict[str, str] | None, live: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        WM_PROJECT_DIR="/usr/share/openfoam",
        LD_LIBRARY_PATH="/usr/lib/openmpi-system",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    names = ["WM_PROJECT_DIR", "LD_LIBRARY_PATH"]
    if shim is not None:
        shim = dict(shim)
        lib = shim.pop("LIB", str(LIB))
        env.update(shim)
        env["LD_PRELOAD"] = lib
        env["RANKPACK_SHIM_DIR"] = str(live)
        names += ["LD_PRELOAD", "RANKPACK_SHIM_DIR", *shim]
    argv = ["mpirun.openmpi", "-np", "4", "--oversubscribe", "--bind-to", "none"]
    for name in names:
        argv += ["-x", name]
    argv += ["simpleFoam", "-parallel"]
    log = open(case / "log.simpleFoam", "wb")  # noqa: SIM115
    return subprocess.Popen(argv, cwd=case, env=env, stdout=log, stderr=subprocess.STDOUT)


def timed(cases: list[Path], shim: dict[str, str] | None, work: Path) -> float:
    t0 = time.monotonic()
    procs = [launch(c, shim, work / f"live-{c.name}") for c in cases]
    for c, p in zip(cases, procs, strict=True):
        if p.wait() != 0 or b"\nEnd\n" not in (c / "log.simpleFoam").read_bytes():
            sys.exit(f"simpleFoam failed in {c}; see {c / 'log.simpleFoam'}")
    return time.monotonic() - t0


def fmt(values: list[float], digits: int = 2) -> str:
    low, high = min(values), max(values)
    return f"{statistics.median(values):.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rankpack-bench"))
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--single-only", action="store_true")
    args = ap.parse_args()
    configs = [parse_config(c) for c in (args.config or ["spin", "polite", "adaptive"])]
    if "spin" not in [n for n, _ in configs]:
        configs.insert(0, parse_config("spin"))
    cases = [args.work / "a", args.work / "b"]
    for case in cases:
        subprocess.run(
            [str(REPO / "bench" / "pitzdaily_case.sh"), str(case), str(args.iterations)], check=True
        )
    labels = [c for c in (args.config or ["spin", "polite", "adaptive"])]
    if len(labels) < len(configs):
        labels.insert(0, "spin")
    single: dict[str, list[float]] = {lab: [] for lab in labels}
    conc: dict[str, list[float]] = {lab: [] for lab in labels}
    print("rep,config,single_s,concurrent_s", flush=True)
    for rep in range(args.reps):
        k = rep % len(configs)
        for label, (_, shim) in (
            list(zip(labels, configs, strict=True))[k:]
            + list(zip(labels, configs, strict=True))[:k]
        ):
            s = timed(cases[:1], shim, args.work)
            c = float("nan") if args.single_only else timed(cases, shim, args.work)
            single[label].append(s)
            conc[label].append(c)
            print(f"{rep},{label},{s:.3f},{c:.3f}", flush=True)
    spin_label = labels[[n for n, _ in configs].index("spin")]
    print()
    print(
        "| config | n | single s | concurrent s | penalty vs spin | gain vs sequential spin"
        " | gain vs sequential same mode |"
    )
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        pen = [s / b for s, b in zip(single[label], single[spin_label], strict=True)]
        gain = [2 * b / c for c, b in zip(conc[label], single[spin_label], strict=True)]
        same = [2 * s / c for s, c in zip(single[label], conc[label], strict=True)]
        print(
            f"| `{label}` | {args.reps} | {fmt(single[label])} | {fmt(conc[label])} | "
            f"{fmt(pen)} | {fmt(gain)} | {fmt(same)} |"
        )


if __name__ == "__main__":
    main()
