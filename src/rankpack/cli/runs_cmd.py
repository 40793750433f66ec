"""`rankpack runs list|show|delete|prune`: recorded runs, read back from the database (never
creating one), and forgotten with their run directories when asked."""

from __future__ import annotations

import argparse
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

from rankpack.cli.common import db_path, parse_id, parse_limit, print_json
from rankpack.cli.operator_cmd import add_read_backend, handle_runs_kubernetes
from rankpack.errors import UserError
from rankpack.report.tables import run_table, runs_list_table
from rankpack.store import RunRow, Store

FINISHED = ("completed", "failed", "interrupted", "requeued")
"""``requeued``: a launch refused for quota (nothing ran; its job went back to the queue)."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("runs", help="list and show recorded runs")
    runs_sub = p.add_subparsers(
        dest="runs_command", metavar="{list,show,delete,prune}", parser_class=type(p)
    )
    runs_sub.required = True
    lp = runs_sub.add_parser(
        "list", help="recorded runs, newest first (--backend kubernetes: finished Simulations)"
    )
    lp.add_argument("--limit", type=parse_limit, default=50, help="at most this many (default 50)")
    add_read_backend(lp, "the finished Simulations of a namespace with their results")
    lp.add_argument("--json", action="store_true")
    lp.set_defaults(handler=handle_list)
    sp = runs_sub.add_parser("show", help="one run with per-rank results and its resizes")
    sp.add_argument("id", type=parse_id, metavar="ID")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(handler=handle_show)
    dp = runs_sub.add_parser("delete", help="forget finished runs and remove their run directories")
    dp.add_argument("ids", type=parse_id, nargs="+", metavar="ID")
    dp.add_argument("--keep-files", action="store_true", help="keep the run directories")
    dp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dp.add_argument("--json", action="store_true")
    dp.set_defaults(handler=handle_delete)
    pp = runs_sub.add_parser(
        "prune",
        help="forget finished runs older than --days (default: failed, interrupted, requeued)",
    )
    pp.add_argument(
        "--status",
        choices=[*FINISHED, "all"],
        action="append",
        help="which runs (repeatable; default failed, interrupted and requeued; all: every finished"
        " run)",
    )
    pp.add_argument(
        "--days", type=parse_limit, default=0, help="only runs created at least this many days ago"
    )
    pp.add_argument("--keep-files", action="store_true", help="keep the run directories")
    pp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    pp.add_argument("--json", action="store_true")
    pp.set_defaults(handler=handle_prune)


def handle_list(args: argparse.Namespace) -> int:
    if args.backend == "kubernetes":
        return handle_runs_kubernetes(args)
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


def handle_delete(args: argparse.Namespace) -> int:
    store = Store(db_path(args), create=False)
    runs = [store.get_run(i) for i in dict.fromkeys(args.ids)]
    busy = [r.id for r in runs if r.status not in FINISHED]
    if busy:
        raise UserError(f"run {', '.join(map(str, busy))} is still running; stop it first (Ctrl-C)")
    return _forget(store, runs, args)


def handle_prune(args: argparse.Namespace) -> int:
    store = Store.open_existing(db_path(args))
    statuses = set(args.status or ["failed", "interrupted", "requeued"])
    if "all" in statuses:
        statuses = set(FINISHED)
    cutoff = datetime.now(UTC) - timedelta(days=args.days)
    runs = [
        r for r in (store.all_runs() if store else [])
        if r.status in statuses and datetime.fromisoformat(r.created_at) <= cutoff
    ]  # fmt: skip
    if store is None or not runs:
        if args.json:
            print_json({"deleted": [], "removed_dirs": [], "kept_dirs": []})
        else:
            Console().print("nothing to prune")
        return 0
    return _forget(store, runs, args)


def _forget(store: Store, runs: list[RunRow], args: argparse.Namespace) -> int:
    dirs = [] if args.keep_files else [Path(r.run_dir) for r in runs]
    if not args.yes:
        what = f"{len(runs)} run(s) ({', '.join(str(r.id) for r in runs)})"
        files = f" and {len(dirs)} run director(ies)" if dirs else ""
        if not sys.stdin.isatty():
            raise UserError(f"this deletes {what}{files}; add --yes to confirm")
        answer = input(f"delete {what}{files}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            Console().print("nothing deleted")
            return 1
    store.delete_runs([r.id for r in runs])
    removed, kept = [], []
    for d in dirs:
        # only a directory rankpack ran something in (it holds .rankpack/) is removed
        if d.is_dir() and (d / ".rankpack").is_dir():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
        elif d.exists():
            kept.append(str(d))
    if args.json:
        print_json({"deleted": [r.id for r in runs], "removed_dirs": removed, "kept_dirs": kept})
    else:
        Console().print(
            f"deleted runs {', '.join(str(r.id) for r in runs)}; removed {len(removed)} run "
            "director(ies)" + (f"; kept (not made by rankpack): {', '.join(kept)}" if kept else "")
        )
    return 0
