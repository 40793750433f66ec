"""`rankpack demo`: the embedded default. pitzDaily from the installed tutorials, 4 ranks,
once with equal CPU and once with CPU proportional to the rank weights, side by side."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys

from rich.console import Console
from rich.table import Table

from rankpack.case.openfoam import resolve_case
from rankpack.cli.backends import add_backend_arguments, make_backend
from rankpack.cli.common import (
    data_dir,
    db_path,
    parse_iterations,
    parse_list,
    parse_ranks,
    parse_repeat,
    print_json,
)
from rankpack.cli.run_cmd import check_submission, run_one, stop_on_signals
from rankpack.controller.submission import Submission
from rankpack.core.results import RunResult
from rankpack.plan.allocation import budget_to_millis, make_plan, resolve_weights
from rankpack.store import Store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="pitzDaily, 4 ranks: equal vs proportional CPU, side by side",
        description=(
            "Run a real OpenFOAM tutorial (default pitzDaily) twice on the local backend: "
            "equal CPU per rank, then CPU proportional to --weights (same total budget, "
            "requests only), and print a comparison table."
        ),
    )
    p.add_argument("--case", default="pitzDaily", help="tutorial or case directory")
    p.add_argument("--ranks", type=parse_ranks, default=4)
    p.add_argument(
        "--weights", type=parse_list, default="1,1,5,15", help="weights of the proportional run"
    )
    p.add_argument(
        "--iterations", type=parse_iterations, default=None, help="default: the case's own end"
    )
    p.add_argument("--repeat", type=parse_repeat, default=1, help="run each configuration N times")
    add_backend_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    weights = resolve_weights(args.weights, args.ranks, False)
    budget = budget_to_millis(float(args.ranks))
    resolve_case(args.case)  # a bad case or solver: one line before anything is created
    data_dir()
    path = db_path(args)
    weighted = importlib.util.find_spec("rankpack.case.partition") is not None
    make_plan(weights, budget)
    configs = [
        ("equal", Submission(args.case, (1.0,) * args.ranks, budget, iterations=args.iterations,
                             sizing="fixed")),
        ("proportional", Submission(args.case, tuple(weights), budget,
                                    iterations=args.iterations,
                                    decompose="weighted" if weighted else "equal",
                                    sizing="fixed")),
    ]  # fmt: skip
    for _, sub in configs:
        check_submission(sub)
    store = Store(path)
    backend = make_backend(args)
    results: dict[str, list[RunResult]] = {name: [] for name, _ in configs}
    interrupted: list[int] = []
    with stop_on_signals() as stop:
        for _ in range(args.repeat):
            for name, sub in configs:  # interleaved: noise hits both alike
                if stop.is_set():
                    break
                result = run_one(
                    sub, backend, store, show=not args.json, stop=stop, label=f"demo-{name}"
                )
                if result.status == "interrupted" or stop.is_set():
                    interrupted.append(result.id)  # recorded as such, not compared
                    break
                results[name].append(result)
            if stop.is_set() or interrupted:
                break
    stopped = bool(interrupted) or stop.is_set()
    if not any(results.values()):
        if stopped:
            _say_interrupted(interrupted)
            return 130
        return 1
    summary = summarise(results)
    summary["interrupted"] = stopped
    summary["interrupted_run_ids"] = interrupted
    if args.json:
        print_json(summary)
    else:
        for table in comparison_tables(summary):
            Console().print(table)
    if stopped:
        _say_interrupted(interrupted)
        return 130
    ok = all(r.status == "completed" for rs in results.values() for r in rs)
    return 0 if ok else 1


def _say_interrupted(run_ids: list[int]) -> None:
    which = f" (run {', '.join(map(str, run_ids))} recorded as interrupted)" if run_ids else ""
    print(
        f"rankpack: demo interrupted{which}; the comparison is incomplete: only finished "
        "runs are shown",
        file=sys.stderr,
    )


def summarise(results: dict[str, list[RunResult]]) -> dict[str, object]:
    base = statistics.median(r.wall_s for r in results["equal"]) if results["equal"] else None
    configs = []
    for name, runs in results.items():
        if not runs:
            continue
        walls = [r.wall_s for r in runs]
        wall = statistics.median(walls)
        last = runs[-1]
        configs.append(
            {
                "config": name,
                "run_ids": [r.id for r in runs],
                "status": [r.status for r in runs],
                "decompose": last.decompose,
                "iterations": last.iterations,
                "wall_s": wall,
                "wall_s_min": min(walls),
                "wall_s_max": max(walls),
                "wall_vs_equal": wall / base if base else None,
                "cpu_s": statistics.median(r.cpu_s for r in runs),
                "nr_throttled": sum(x.nr_throttled for x in last.ranks),
                "ranks": [
                    {
                        "rank": x.rank,
                        "weight": x.weight,
                        "cells": x.cells,
                        "cpu_millis": x.cpu_millis,
                        "cpu_s": x.cpu_s,
                        "nr_throttled": x.nr_throttled,
                        "throttled_s": x.throttled_s,
                    }
                    for x in last.ranks
                ],
            }
        )
    case = next(r.case for rs in results.values() for r in rs)
    return {"case": case, "configs": configs}


def comparison_tables(summary: dict[str, object]) -> list[Table]:
    configs = summary["configs"]
    assert isinstance(configs, list)
    note = " - INTERRUPTED, incomplete" if summary.get("interrupted") else ""
    overview = Table(
        title=f"rankpack demo: {summary['case']}, equal vs proportional CPU (requests only){note}",
        caption="wall: median (min-max) over repeats; CPU-s: trapezoidal integral of ~1 Hz "
        "cgroup samples; throttled: CFS throttling events, 0 without limits",
    )
    for col in ("config", "decomposition", "iterations", "wall s", "vs equal", "CPU-s",
                "throttled"):  # fmt: skip
        overview.add_column(col, justify="left" if col in ("config", "decomposition") else "right")
    for c in configs:
        overview.add_row(
            c["config"],
            c["decompose"],
            str(c["iterations"]),
            f"{c['wall_s']:.1f} ({c['wall_s_min']:.1f}-{c['wall_s_max']:.1f})",
            f"{c['wall_vs_equal']:.2f}x" if c["wall_vs_equal"] else "-",
            f"{c['cpu_s']:.1f}",
            str(c["nr_throttled"]),
        )
    per_rank = Table(title="per rank (last repeat): cells / CPU request / CPU-seconds used")
    per_rank.add_column("rank", justify="right")
    for c in configs:
        for what in ("cells", "request", "CPU-s"):
            per_rank.add_column(f"{c['config'][:5]} {what}", justify="right")
    n = len(configs[0]["ranks"])
    for i in range(n):
        row = [str(i)]
        for c in configs:
            r = c["ranks"][i]
            row += [str(r["cells"]), f"{r['cpu_millis']}m", f"{r['cpu_s']:.2f}"]
        per_rank.add_row(*row)
    return [overview, per_rank]
