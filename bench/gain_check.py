#!/usr/bin/env python3
"""Does a session that never co-locates report no gain? (issue 42)

  .venv/bin/python bench/gain_check.py [--reps 3] [--scale 3] [--iterations 100] [--out F]

Each repetition, in a fresh database: pitzDaily refined ``--scale`` x in x and y
(`scaled_pitzdaily.py`; 3: 110 025 cells, the user-sized case), two copies queued with
``rankpack submit --ranks 4 --weights 1,1,5,15 --budget 2``, run by ``rankpack multiplex
--max-concurrent 1`` (so they never run at once) with its default ``--baseline auto``: the
single-run baseline is measured in the same session, with the same case and settings. It
prints, per run, how it started (learned sizes or profiled), its staging, wall time and
CPU-seconds, and per repetition the session's gain, each queued run against the baseline
(wall and CPU-seconds, in %), the load average before and after and what the session
named apart from the gain. A session that never co-locates should report a gain
within 0.95-1.05, and its baseline and queued runs should agree within 5 %.
Root (cgroups); 2 cores, ~2 min a repetition: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rankpack.store import Store

HERE = Path(__file__).resolve().parent
RANKPACK = str(Path(sys.executable).parent / "rankpack")


def rankpack(env: dict[str, str], *argv: str) -> str:
    out = subprocess.run([RANKPACK, *argv], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"rankpack {' '.join(argv)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return out.stdout


def run_facts(store: Store, run_id: int) -> dict[str, Any]:
    """What a run did, from the store: its start, staging, wall and CPU-seconds."""
    run = store.get_run(run_id)
    sim = run.options.get("sim_id")
    events = [e for e in store.events() if e.detail.get("sim") == sim or e.run_id == run_id]
    stage = next((e for e in events if e.kind == "stage"), None)
    launch = next((e for e in events if e.kind == "launch"), None)
    learned = next((e for e in events if e.kind == "learned-sizes"), None)
    return {
        "run": run.id,
        "label": run.options.get("label"),
        "start": run.options.get("start") or ("learned" if learned else "profiled"),
        "staged_ahead": bool(stage and stage.detail.get("staged_ahead")),
        "claim_to_launch_s": round(launch.t_s - stage.t_s, 2) if stage and launch else None,
        "wall_s": round(run.wall_s or 0.0, 2),
        "cpu_s": round(run.cpu_s or 0.0, 2),
        "size_resizes": sum(1 for z in run.resizes if z.kind == "size"),
        "wait_switches": [e.detail.get("mode") for e in events if e.kind == "wait-mode"],
    }


def one(case: Path, iterations: int) -> dict[str, Any]:
    load = [os.getloadavg()[0]]
    home = Path(tempfile.mkdtemp(prefix="gain-check-"))
    env = {**os.environ, "RANKPACK_HOME": str(home), "RANKPACK_DB": str(home / "db.sqlite")}
    rankpack(env, "submit", str(case), "--ranks", "4", "--weights", "1,1,5,15", "--budget", "2",
             "--iterations", str(iterations), "--count", "2", "--json")  # fmt: skip
    data = json.loads(rankpack(env, "multiplex", "--max-concurrent", "1", "--json"))
    load.append(os.getloadavg()[0])
    store = Store(home / "db.sqlite")
    queued = [run_facts(store, s["id"]) for s in data["simulations"]]
    mine = {s["id"] for s in data["simulations"]}
    singles = [run_facts(store, r.id) for r in store.all_runs() if r.id not in mine]
    baseline = [r for r in singles if r["label"] == "baseline"][-1]
    return {
        "gain": data["throughput_gain"],
        "max_concurrent_seen": data["max_concurrent_seen"],
        "makespan_s": data["makespan_s"],
        "sequential_s": data["sequential_s"],
        "summary": {k: v for k, v in data.items() if k not in ("simulations", "gate")},
        "singles": singles,
        "queued": queued,
        "load": [round(x, 2) for x in load],
        # each queued run against the baseline, in % (+: the queued run took more)
        "wall_diff_pct": [round(100 * (q["wall_s"] / baseline["wall_s"] - 1), 1) for q in queued],
        "cpu_diff_pct": [round(100 * (q["cpu_s"] / baseline["cpu_s"] - 1), 1) for q in queued],
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--out", type=Path, help="also write every repetition here (JSON)")
    args = ap.parse_args()
    case = Path(tempfile.mkdtemp(prefix="gain-case-")) / f"pitzDaily-x{args.scale}"
    subprocess.run([sys.executable, str(HERE / "scaled_pitzdaily.py"), str(case),
                    "--scale", str(args.scale)], check=True, capture_output=True)  # fmt: skip
    reps = []
    for rep in range(args.reps):
        r = one(case, args.iterations)
        reps.append(r)
        for row in r["singles"] + r["queued"]:
            print(f"rep {rep} " + json.dumps(row), flush=True)
        apart = r["summary"].get("other_effects") or []
        print(f"rep {rep}: gain {r['gain']}, max_concurrent_seen {r['max_concurrent_seen']}, "
              f"queued vs baseline: wall {r['wall_diff_pct']} %, "
              f"CPU-s {r['cpu_diff_pct']} %; load average {r['load']}; not in the gain: "
              f"{'; '.join(apart) or '-'}", flush=True)  # fmt: skip
    gains = [float(r["gain"]) for r in reps if r["gain"] is not None]
    print(f"gain: {spread(gains)} (median [min-max], {len(gains)} sessions)")
    walls = [d for r in reps for d in r["wall_diff_pct"]]
    cpus = [d for r in reps for d in r["cpu_diff_pct"]]
    print(f"queued runs vs their baseline, wall %: {spread(walls)}")
    print(f"queued runs vs their baseline, CPU-s %: {spread(cpus)}")
    if args.out:
        args.out.write_text(json.dumps(reps, indent=1) + "\n")
    ok = all(0.95 <= g <= 1.05 for g in gains) and len(gains) == len(reps)
    ok = ok and all(abs(d) <= 5 for d in walls + cpus)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
