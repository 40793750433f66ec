"""`rankpack runs list|show`: read recorded runs back from the database."""

from __future__ import annotations

import argparse

from rich.console import Console

from rankpack.cli.common import db_path, parse_id, parse_limit, print_json
from rankpack.report.results import RankResult, RunResult
from rankpack.report.tables import run_table, runs_list_table
from rankpack.store import Store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("runs", help="list and show recorded runs")
    runs_sub = p.add_subparsers(dest="runs_command", metavar="{list,show}", parser_class=type(p))
    runs_sub.required = True
    lp = runs_sub.add_parser("list", help="recorded runs, newest first")
    lp.add_argument("--limit", type=parse_limit, default=50, help="at most this many (default 50)")
    lp.add_argument("--json", action="store_true")
    lp.set_defaults(handler=handle_list)
    sp = runs_sub.add_parser("show", help="one run with per-rank results")
    sp.add_argument("id", type=parse_id, metavar="ID")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(handler=handle_show)


def handle_list(args: argparse.Namespace) -> int:
    runs = Store(db_path(args)).list_runs(args.limit)
    if args.json:
        print_json(runs)
    elif not runs:
        Console().print("no runs recorded yet; try `rankpack demo` or `rankpack run pitzDaily`")
    else:
        Console().print(runs_list_table(runs))
    return 0


def result_from_record(d: dict[str, object]) -> RunResult:
    ranks = tuple(
        RankResult(**{k: r.get(k) for k in RankResult.__dataclass_fields__})
        for r in d["ranks"]  # type: ignore[attr-defined]
    )
    return RunResult(
        id=d["id"],  # type: ignore[arg-type]
        status=d["status"],  # type: ignore[arg-type]
        case=d["case_name"],  # type: ignore[arg-type]
        solver=d["solver"],  # type: ignore[arg-type]
        run_dir=d["run_dir"],  # type: ignore[arg-type]
        n_ranks=d["n_ranks"],  # type: ignore[arg-type]
        qos=d["qos"],  # type: ignore[arg-type]
        total_millis=d["total_millis"],  # type: ignore[arg-type]
        iterations=d["iterations"],  # type: ignore[arg-type]
        expected_iterations=d["expected_iterations"],  # type: ignore[arg-type]
        wall_s=d["wall_s"] or 0.0,  # type: ignore[arg-type]
        cpu_s=d["cpu_s"] or 0.0,  # type: ignore[arg-type]
        exit_code=d["exit_code"],  # type: ignore[arg-type]
        cgroups=d["cgroups"],  # type: ignore[arg-type]
        message=d["message"],  # type: ignore[arg-type]
        ranks=ranks,
        decompose=d["decompose"],  # type: ignore[arg-type]
    )


def handle_show(args: argparse.Namespace) -> int:
    record = Store(db_path(args)).get_run(args.id)
    if args.json:
        print_json(record)
    else:
        Console().print(run_table(result_from_record(record)))
    return 0
