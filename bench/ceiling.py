#!/usr/bin/env python3
"""How close does `rankpack multiplex` get to the same pair run with no controller at all?

  .venv/bin/python bench/ceiling.py [--reps 4] [--iterations 150] [--millis 290,710]

Issue 13's weighted workload (the scaled pitzDaily of `bench/scaled_pitzdaily.py`, 2 ranks,
weights 1,3, weighted decomposition). Each repetition runs, alternating which comes first:

* **in the loop**: ``rankpack multiplex --baseline measure --json`` with defaults on two
  queued copies, in a fresh database (so the baseline is one single run measured first,
  and the copies start from the sizes it learned): makespan and gain;
* **no controller** (`bench/cgroup_pairs.py`'s runner, on the decomposed directory of the
  first repetition's baseline run): the two copies one after the other in `spin` (the
  issue's reference) and together, polite, each rank in a cgroup of its own weighted as the
  kubelet maps ``--millis`` (rankpack's duty-cycle split by default).

Both run the same iterations of the same decomposed case. Prints per repetition and then
the median (min-max) of: the in-loop gain, the no-controller pair's gain against the two
`spin` runs, and the pair's wall time / the in-loop makespan (1.0: rankpack's session costs
nothing beyond the bare pair; below 1: the session is that much slower).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cgroup_pairs
import colocation


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def no_controller(
    run_dir: Path, iterations: int, stem: Path, wrap: Path, millis: tuple[int, int]
) -> tuple[float, float]:
    """(two `spin` copies one after the other, the polite pair in weighted cgroups) wall s."""
    spin = {"RANKPACK_SHIM_WAIT": "spin"}
    spin_seq = cgroup_pairs.run_fresh(run_dir, iterations, stem.with_name(stem.name + "-spin"),
                                      "plain", wrap, False, spin)  # fmt: skip
    made = cgroup_pairs.make_cgroups("shares", millis)
    try:
        pair = cgroup_pairs.run_fresh(run_dir, iterations, stem.with_name(stem.name + "-pair"),
                                      "shares", wrap, True, {})  # fmt: skip
    finally:
        cgroup_pairs.remove_cgroups(made)
    return spin_seq, pair


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--millis", default="290,710", help="the no-controller pair's requests (m)")
    args = ap.parse_args()
    try:
        m0, m1 = (int(x) for x in args.millis.split(","))
    except ValueError:
        print(f"error: --millis {args.millis!r}: want A,B (millicores)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="ceiling-"))
    scaled = tmp / "pitzDaily"
    subprocess.run([sys.executable, str(colocation.ROOT / "bench" / "scaled_pitzdaily.py"),
                    str(scaled)], check=True, capture_output=True)  # fmt: skip
    work = colocation.Workload(
        "scaled, weighted 1:3", str(scaled),
        ("--iterations", str(args.iterations), "--ranks", "2", "--weights", "1,3",
         "--decompose", "weighted"),
    )  # fmt: skip
    wrap = tmp / "wrap.sh"
    wrap.write_text(cgroup_pairs.WRAP.format(root=cgroup_pairs.CPU_ROOT))
    wrap.chmod(0o755)
    run_dir: Path | None = None
    rows: list[tuple[float, float, float, float]] = []
    print("rep,in_loop_gain,in_loop_makespan_s,spin_sequential_s,pair_s,pair_gain,pair/makespan")
    try:
        for rep in range(args.reps):
            loop: dict[str, float] = {}
            bare: tuple[float, float] = (0.0, 0.0)
            first = "loop" if rep % 2 == 0 or run_dir is None else "bare"
            for step in (first, "bare" if first == "loop" else "loop"):
                if step == "loop":
                    home = Path(tempfile.mkdtemp(prefix="home-", dir=tmp))
                    loop = colocation.session(work, 2, "auto", home=home)
                    if run_dir is None:
                        # the single-run baseline the session measured first: its oldest run
                        run_dir = sorted(d for d in (home / "runs").iterdir() if d.is_dir())[0]
                else:
                    assert run_dir is not None
                    bare = no_controller(run_dir, args.iterations, tmp / f"r{rep}", wrap, (m0, m1))
            spin_seq, pair = bare
            row = (loop["gain"], loop["makespan_s"], spin_seq / pair, pair / loop["makespan_s"])
            rows.append(row)
            print(f"{rep},{row[0]:.3f},{row[1]:.2f},{spin_seq:.2f},{pair:.2f},{row[2]:.3f},"
                  f"{row[3]:.3f}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("| in the loop: gain | no controller: pair vs two spin runs "
          "| pair wall / in-loop makespan |")  # fmt: skip
    print("|---|---|---|")
    print(f"| {fmt([r[0] for r in rows])}x | {fmt([r[2] for r in rows])}x "
          f"| {fmt([r[3] for r in rows])} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
