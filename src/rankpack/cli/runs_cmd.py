"""`rankpack runs list|show`: read recorded runs back from the database (never creates one)."""

from __future__ import annotations

import argparse

from rich.console import Console

from rankpack.cli.common import db_path, parse_id, parse_limit, print_json
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
    sp = runs_sub.add_parser("show", help="one run with per-rank results and its resizes")
    sp.add_argument("id", type=parse_id, metavar="ID")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(handler=handle_show)


def handle_list(args: argparse.Namespace) -> int:
    store = Store.open_existing(db_path(args))
    runs = store.list_runs(args.limit) if store is not None else []
    if args.json:
        print_json([r.to_json() for r in runs])
    elif not runs:
        Console().print("no runs recorded yet; try `rankpack demo` or `rankpack run pitzDaily`")
    else:
        Console().print(runs_list_table(runs))
    return 0


def handle_show(args: argparse.Namespace) -> int:
    record = Store(db_path(args), create=False).get_run(args.id)
    if args.json:
        print_json(record.to_json())
    else:
        Console().print(run_table(record.result()))
    return 0
