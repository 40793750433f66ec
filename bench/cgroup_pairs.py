#!/usr/bin/env python3
"""Does running each rank in a cgroup of its own cost co-location its gain?

  .venv/bin/python bench/cgroup_pairs.py CASE_RUN_DIR [--reps 3] [--iterations 150]
      [--placements plain,shares,equal,pinned,shares-pinned] [--config NAME:KNOB=V,...]
      [--spin-reference]

CASE_RUN_DIR is a decomposed run directory rankpack made (for example the scaled
pitzDaily of bench/scaled_pitzdaily.py after `rankpack run CASE --ranks 2 --weights 1,3
--decompose weighted`). Outside rankpack's control loop, with the installed shim in
`polite` mode, it runs two copies of the case one after the other and together, in each
placement and shim configuration (``--config``, RANKPACK_SHIM_* knobs), alternated within
each repetition:

- ``plain``: the ranks in the caller's cgroup (how FACTS.md measured 1.30x);
- ``shares``: each rank in a cgroup of its own under rankpack's own cgroup root, cpu
  weights from the given requests (kubelet mapping), as the local backend does;
- ``equal``: the same cgroups, every rank the same weight;
- ``pinned`` / ``shares-pinned``: as plain / shares, and copy i's rank r pinned to core
  (i + r) mod cores, so each core holds one rank of every copy.

It prints per placement the median sequential and pair wall times and the gain
(sequential / pair) with its spread. With ``--spin-reference`` each repetition also runs
the two copies one after the other in `spin` mode (plain placement), the issue's
reference, and prints the gain against that too (two `spin` runs / pair). Only
rankpack's cgroup subtree is touched; every cgroup it creates is removed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankpack.case.openfoam import foam_env
from rankpack.profile.shim import shim_env

CPU_ROOT = Path("/sys/fs/cgroup/cpu/rankpack")
WRAP = """#!/bin/sh
# move this rank into its cgroup and/or pin it to a core, then become the solver
if [ -n "$RP_CG" ]; then
  echo $$ > "{root}/$RP_PAIR_TAG-$OMPI_COMM_WORLD_RANK/cgroup.procs" || exit 97
fi
if [ -n "$RP_PIN" ]; then
  # copy i, rank r on core (i + r) mod cores: each core gets one rank of every copy
  exec taskset -c $(( (${{RP_PAIR_TAG#p}} + OMPI_COMM_WORLD_RANK) % $(nproc) )) "$@"
fi
exec "$@"
"""


def shares(millis: int) -> int:
    return max(2, millis * 1024 // 1000)


def copy_case(src: Path, dst: Path, iterations: int) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("log.*", ".rankpack"))
    for proc in dst.glob("processor*"):
        for t in proc.iterdir():
            if t.name not in ("0", "constant") and t.name.replace(".", "").isdigit():
                shutil.rmtree(t)
    cd = dst / "system" / "controlDict"
    lines = []
    for line in cd.read_text().splitlines():
        if line.strip().startswith("endTime"):
            line = f"endTime         {iterations};"
        if line.strip().startswith("writeInterval"):
            line = f"writeInterval   {iterations};"
        lines.append(line)
    cd.write_text("\n".join(lines) + "\n")


def start(
    case: Path, tag: str, placement: str, wrap: Path, live: Path, extra: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {**foam_env(dict(os.environ)), **shim_env(live, "polite"), **extra, "RP_PAIR_TAG": tag}
    base = placement.removesuffix("-pinned")
    env["RP_CG"] = "1" if base not in ("plain", "pinned") else ""
    env["RP_PIN"] = "1" if placement.endswith("pinned") else ""
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
            "-x", "WM_PROJECT_DIR", "-x", "LD_LIBRARY_PATH", "-x", "LD_PRELOAD",
            "-x", "RP_PAIR_TAG", "-x", "RP_CG", "-x", "RP_PIN"]  # fmt: skip
    for key in sorted(env):
        if key.startswith("RANKPACK_SHIM_"):
            argv += ["-x", key]
    if env["RP_CG"] or env["RP_PIN"]:
        argv.append(str(wrap))
    argv += ["simpleFoam", "-parallel"]
    log = open(case / "log.simpleFoam", "wb")  # noqa: SIM115
    return subprocess.Popen(argv, cwd=case, env=env, stdout=log, stderr=subprocess.STDOUT)


def run(
    cases: list[Path], placement: str, wrap: Path, tmp: Path, together: bool, extra: dict[str, str]
) -> float:
    t0 = time.monotonic()
    lives = [tmp / f"live{i}-{time.monotonic_ns()}" for i in range(len(cases))]
    if together:
        procs = [start(c, f"p{i}", placement, wrap, lives[i], extra) for i, c in enumerate(cases)]
        codes = [p.wait() for p in procs]
    else:
        codes = [start(c, f"p{i}", placement, wrap, lives[i], extra).wait()
                 for i, c in enumerate(cases)]  # fmt: skip
    if any(codes):
        tail = (cases[0] / "log.simpleFoam").read_text(errors="replace")[-800:]
        raise SystemExit(f"error: a run failed ({codes}); {cases[0]}/log.simpleFoam ends:\n{tail}")
    return time.monotonic() - t0


def run_fresh(
    run_dir: Path, iterations: int, stem: Path, placement: str, wrap: Path, together: bool,
    extra: dict[str, str],
) -> float:  # fmt: skip
    """Two fresh copies of the case (``stem``-0, -1), timed by `run`, then removed."""
    cases = [stem.with_name(f"{stem.name}-{i}") for i in range(2)]
    for c in cases:
        copy_case(run_dir, c, iterations)
    try:
        return run(cases, placement, wrap, stem.parent, together, extra)
    finally:
        for c in cases:
            shutil.rmtree(c, ignore_errors=True)


def make_cgroups(placement: str, millis: tuple[int, ...]) -> list[Path]:
    """A cgroup per rank of each copy; ``millis``: both ranks' requests, the same for both
    copies (A,B), or per copy (A,B,C,D: copy 0's ranks, then copy 1's)."""
    made = []
    for i in range(2):
        for rank in range(2):
            d = CPU_ROOT / f"p{i}-{rank}"
            d.mkdir(exist_ok=True)
            m = millis[2 * i + rank if len(millis) == 4 else rank]
            (d / "cpu.shares").write_text(
                str(shares(m) if placement.startswith("shares") else 1024)
            )
            made.append(d)
    return made


def remove_cgroups(made: list[Path]) -> None:
    """Remove the cgroups `make_cgroups` made, waiting up to 5 s each for the kernel to let
    go of a rank that just exited."""
    for d in made:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--millis", default="290,710",
                    help="the two ranks' requests (m), or A,B,C,D per copy; several splits "
                    "separated by '/' (e.g. 290,710/250,750) are alternated within each "
                    "repetition")  # fmt: skip
    ap.add_argument("--placements", default="plain,shares,equal",
                    help="comma-separated subset of plain,shares,equal,pinned,shares-pinned "
                    "(pinned: copy i's rank r on core (i+r) mod cores)")  # fmt: skip
    ap.add_argument("--config", action="append", default=[], metavar="NAME[:KNOB=V,...]",
                    help="shim settings to compare (RANKPACK_SHIM_ prefix implied), e.g. "
                    "'short:SLEEP_MAX_US=50' 'long:SLEEP_MAX_US=400'; default: none")  # fmt: skip
    ap.add_argument("--spin-reference", action="store_true",
                    help="also run two spin copies one after the other per repetition and "
                    "report each pair against them")  # fmt: skip
    args = ap.parse_args()
    configs: dict[str, dict[str, str]] = {}
    for spec in args.config or ["default"]:
        name, _, knobs = spec.partition(":")
        configs[name] = {
            f"RANKPACK_SHIM_{k}": v for k, v in (kv.split("=", 1) for kv in knobs.split(",") if kv)
        }
    if not (args.run_dir / "processor1").is_dir():
        print(f"error: {args.run_dir} is not a decomposed 2-rank run directory", file=sys.stderr)
        return 2
    try:
        splits = [tuple(int(x) for x in sp.split(",")) for sp in args.millis.split("/")]
    except ValueError:
        splits = []
    if not splits or any(len(sp) not in (2, 4) or min(sp) < 2 for sp in splits):
        print(f"error: --millis {args.millis!r}: want A,B[/A,B...] or A,B,C,D per copy"
              " (millicores, each >= 2)", file=sys.stderr)  # fmt: skip
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="cgpairs-"))
    wrap = tmp / "wrap.sh"
    wrap.write_text(WRAP.format(root=CPU_ROOT))
    wrap.chmod(0o755)
    variants = [
        (p, c, sp)
        for p in args.placements.split(",")
        for c in configs
        for sp in (splits if p.startswith("shares") else splits[:1])
    ]

    def label(p: str, c: str, sp: tuple[int, ...]) -> str:
        return (
            f"{p} {'/'.join(map(str, sp))} {c}"
            if p.startswith("shares") and len(splits) > 1
            else f"{p} {c}"
        )

    results: dict[str, list[tuple[float, float]]] = {label(*v): [] for v in variants}
    spin_seq: list[float] = []
    try:
        for rep in range(args.reps):
            if args.spin_reference:
                spin = {"RANKPACK_SHIM_WAIT": "spin"}
                spin_seq.append(run_fresh(args.run_dir, args.iterations, tmp / f"r{rep}-spin",
                                          "plain", wrap, False, spin))  # fmt: skip
                print(f"rep {rep} spin reference  sequential {spin_seq[-1]:6.2f} s", flush=True)
            for placement, config, split in variants:
                extra = configs[config]
                key = label(placement, config, split)
                cg = placement.removesuffix("-pinned") not in ("plain", "pinned")
                made = make_cgroups(placement, split) if cg else []
                try:
                    walls = [run_fresh(args.run_dir, args.iterations,
                                       tmp / f"r{rep}-{placement}-{config}-{split[0]}-{together}",
                                       placement, wrap, together, extra)
                             for together in (False, True)]  # fmt: skip
                finally:
                    remove_cgroups(made)
                seq, pair = walls
                results[key].append((seq, pair))
                print(f"rep {rep} {key:24s} sequential {seq:6.2f} s  pair {pair:6.2f} s  "
                      f"gain {seq / pair:.2f}x", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ref = " vs two spin runs: median | range |" if spin_seq else ""
    head = "| placement | sequential s (median) | pair s (median) | gain median | gain range |"
    print(f"\n{head}{ref}")
    print("|---|---|---|---|---|" + ("---|---|" if spin_seq else ""))
    for placement, rows in results.items():
        gains = [s / p for s, p in rows]
        line = (f"| {placement} | {statistics.median(s for s, _ in rows):.2f} | "
                f"{statistics.median(p for _, p in rows):.2f} | {statistics.median(gains):.2f}x | "
                f"{min(gains):.2f}-{max(gains):.2f} |")  # fmt: skip
        if spin_seq:
            vs = [ref_s / p for ref_s, (_, p) in zip(spin_seq, rows, strict=True)]
            line += f" {statistics.median(vs):.2f}x | {min(vs):.2f}-{max(vs):.2f} |"
        print(line)
    if spin_seq:
        print(f"\ntwo spin runs one after the other: median {statistics.median(spin_seq):.2f} s "
              f"({min(spin_seq):.2f}-{max(spin_seq):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
