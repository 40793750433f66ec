#!/usr/bin/env python3
"""Issue 13's benchmark: does `rankpack multiplex` with its defaults gain from co-location?

For each workload and N = 1..max-n, every repetition runs, each in a fresh database (so
nothing is learned from an earlier configuration):

* ``rankpack multiplex --json`` with defaults on N queued copies (wait ``auto``, gate
  ``auto``, the single-run baseline measured first in the same database): measured gain
  (sequential / makespan), the physical limit (``throughput_limit``), their ratio, how many
  ran at once, and the gate's prediction for two (from its launch or launch-held event);
* for N = 2 also ``--gate off`` (pack whenever the requests fit): the gain the gate's
  prediction is checked against (gate error = predicted / measured-packed - 1);
* the single-run penalty of ``auto`` against ``spin``: ``rankpack run`` alone, both modes,
  alternated, in the same repetition.

``--learned``: instead, per workload, one database kept across the repetitions (as a user's
machine keeps its own): each repetition runs the defaults on 2 copies, then ``--gate off``
on 2 copies. From the second repetition on, the default gate's efficiency is learned from
the earlier repetitions' sessions of that workload, and its prediction is checked against
the ``--gate off`` gain measured after it in the same repetition (never one it learned
from). Every session measures its own single-run baseline first (``--baseline measure``).

Workloads: the scaled pitzDaily (48 900 cells, `bench/scaled_pitzdaily.py`), 2 ranks,
weights 1,3 (weighted decomposition) and equal; pitzDaily with 4 ranks (the demo's).
Configurations are rotated between repetitions. Prints CSV rows as it goes, then a
Markdown table of medians and (min-max).

  .venv/bin/python bench/colocation.py --reps 3 --max-n 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKPACK = str(ROOT / ".venv" / "bin" / "rankpack")
PREDICTS = re.compile(r"predicts throughput x(\d+(?:\.\d+)?|inf)")


@dataclass(frozen=True)
class Workload:
    name: str
    case: str
    args: tuple[str, ...]


def workloads(scaled: Path, iterations: int, demo_iterations: int) -> list[Workload]:
    common = ("--iterations", str(iterations), "--ranks", "2")
    return [
        Workload("scaled, weighted 1:3", str(scaled),
                 (*common, "--weights", "1,3", "--decompose", "weighted")),
        Workload("scaled, equal", str(scaled), (*common, "--decompose", "equal")),
        Workload("pitzDaily, 4 ranks", "pitzDaily",
                 ("--ranks", "4", "--iterations", str(demo_iterations))),
    ]  # fmt: skip


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "RANKPACK_HOME": str(home), "RANKPACK_DB": str(home / "db.sqlite")}


def _rankpack(env: dict[str, str], *argv: str) -> str:
    out = subprocess.run([RANKPACK, *argv], env=env, check=True, capture_output=True, text=True)
    return out.stdout


def session(w: Workload, n: int, gate: str, home: Path | None = None) -> dict[str, float]:
    fresh = home is None
    home = home or Path(tempfile.mkdtemp(prefix="coloc-"))
    env = _env(home)
    _rankpack(env, "submit", w.case, *w.args, "--count", str(n))
    baseline = () if fresh else ("--baseline", "measure")
    data = json.loads(_rankpack(env, "multiplex", "--gate", gate, *baseline, "--json"))
    events = json.loads(
        _rankpack(env, "events", "--json", "--multiplex", str(data["multiplex_id"]))
    )
    predicted = None
    for e in events:
        m = PREDICTS.search(str(e.get("detail", {}).get("reason", "")))
        if m and e.get("kind") in ("stage", "launch-held"):
            predicted = float(m.group(1))
            break
    limit = data.get("throughput_limit")
    gain = data["throughput_gain"]
    return {
        "gain": gain,
        "limit": limit if limit is not None else float("nan"),
        "ratio": gain / limit if limit else float("nan"),
        "predicted": predicted if predicted is not None else float("nan"),
        "max_seen": data["max_concurrent_seen"],
        "efficiency": float((data.get("gate") or {}).get("colocation_efficiency") or "nan"),
        "makespan_s": data["makespan_s"],
        "resizes": data["resizes"],
        "restarts": data["restarts"],
    }


def single(w: Workload, wait: str) -> float:
    home = Path(tempfile.mkdtemp(prefix="single-"))
    data = json.loads(_rankpack(_env(home), "run", w.case, *w.args, "--wait", wait, "--json"))
    return float(data["wall_s"])


def _stat(values: list[float], fmt: str = "{:.2f}") -> str:
    v = [x for x in values if x == x]
    if not v:
        return "-"
    med = fmt.format(statistics.median(v))
    return med if len(v) == 1 else f"{med} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def learned(loads: list[Workload], reps: int) -> int:
    homes = {w.name: Path(tempfile.mkdtemp(prefix="learned-")) for w in loads}
    rows: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {}
    print("rep,workload,gate,gain,limit,ratio,efficiency,predicted,max_seen,makespan_s", flush=True)
    for rep in range(reps):
        for w in loads:
            auto = session(w, 2, "auto", homes[w.name])
            off = session(w, 2, "off", homes[w.name])
            rows.setdefault(w.name, []).append((auto, off))
            for gate, r in (("auto", auto), ("off", off)):
                print(f"{rep},{w.name},{gate},{r['gain']:.3f},{r['limit']:.3f},{r['ratio']:.3f},"
                      f"{r['efficiency']:.3f},{r['predicted']:.3f},{r['max_seen']},"
                      f"{r['makespan_s']:.1f}", flush=True)  # fmt: skip
    print()
    print(
        "| workload | learned efficiency | gate's prediction for 2 | measured with --gate off "
        "| gate error | defaults' gain | ran at once |"
    )
    print("|---|---|---|---|---|---|---|")
    for w in loads:
        later = rows[w.name][1:]  # the first repetition has nothing to learn from
        errors = [
            a["predicted"] / o["gain"] - 1 for a, o in later if a["predicted"] == a["predicted"]
        ]
        print(f"| {w.name} | {_stat([a['efficiency'] for a, _ in later])} | "
              f"{_stat([a['predicted'] for a, _ in later], '{:.3f}')} | "
              f"{_stat([o['gain'] for _, o in later])} | {_stat(errors, '{:+.1%}')} | "
              f"{_stat([a['gain'] for a, _ in later])} | "
              f"{max((int(a['max_seen']) for a, _ in later), default=0)} |")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-n", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=150, help="scaled pitzDaily")
    ap.add_argument("--demo-iterations", type=int, default=200, help="4-rank pitzDaily")
    ap.add_argument("--only", help="run only workloads whose name contains this")
    ap.add_argument("--learned", action="store_true", help="the gate learning across sessions")
    args = ap.parse_args()
    scaled = Path(tempfile.mkdtemp(prefix="scaled-")) / "pitzDaily"
    subprocess.run([sys.executable, str(ROOT / "bench" / "scaled_pitzdaily.py"), str(scaled)],
                   check=True, capture_output=True)  # fmt: skip
    loads = [w for w in workloads(scaled, args.iterations, args.demo_iterations)
             if not args.only or args.only in w.name]  # fmt: skip
    if args.learned:
        return learned(loads, args.reps)
    jobs = [(w, n, "auto") for w in loads for n in range(1, args.max_n + 1)]
    jobs += [(w, 2, "off") for w in loads if args.max_n >= 2]
    sessions: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    penalty: dict[str, list[float]] = {}
    print("rep,workload,n,gate,gain,limit,ratio,predicted,max_seen,makespan_s", flush=True)
    for rep in range(args.reps):
        k = rep % len(jobs)
        for w, n, gate in jobs[k:] + jobs[:k]:
            r = session(w, n, gate)
            sessions.setdefault((w.name, n, gate), []).append(r)
            print(f"{rep},{w.name},{n},{gate},{r['gain']:.3f},{r['limit']:.3f},"
                  f"{r['ratio']:.3f},{r['predicted']:.3f},{r['max_seen']},"
                  f"{r['makespan_s']:.1f}", flush=True)  # fmt: skip
        for w in loads:
            order = ("spin", "auto") if rep % 2 == 0 else ("auto", "spin")
            walls = {wait: single(w, wait) for wait in order}
            penalty.setdefault(w.name, []).append(walls["auto"] / walls["spin"] - 1)
            print(f"{rep},{w.name},1,single,spin {walls['spin']:.2f} s,auto "
                  f"{walls['auto']:.2f} s", flush=True)  # fmt: skip
    print()
    print(
        "| workload | N | gate | runs | gain vs sequential | limit | gain / limit "
        "| gate's prediction for 2 | ran at once (max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, n, gate), rs in sessions.items():
        print(f"| {name} | {n} | {gate} | {len(rs)} | {_stat([r['gain'] for r in rs])} | "
              f"{_stat([r['limit'] for r in rs])} | {_stat([r['ratio'] for r in rs])} | "
              f"{_stat([r['predicted'] for r in rs], '{:.3f}')} | "
              f"{max(int(r['max_seen']) for r in rs)} |")  # fmt: skip
    print()
    print(
        "| workload | gate error for 2 (prediction / measured gain with --gate off - 1) "
        "| single-run penalty of auto vs spin |"
    )
    print("|---|---|---|")
    for w in loads:
        preds = [r["predicted"] for r in sessions.get((w.name, 2, "auto"), [])]
        packed = [r["gain"] for r in sessions.get((w.name, 2, "off"), [])]
        errors = [p / g - 1 for p, g in zip(preds, packed, strict=False) if p == p and g]
        print(
            f"| {w.name} | {_stat(errors, '{:+.1%}')} | "
            f"{_stat(penalty.get(w.name, []), '{:+.1%}')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
