"""`rankpack profile CASE ...` (run an OpenFOAM case with the shim and report duty cycles)
and `rankpack profile --attach RUN_ID` (read the live records of a running `rankpack run`)."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rankpack.backend.local import LocalBackend
from rankpack.backend.mpirun import shim_dir
from rankpack.cli import OneLineArgumentParser
from rankpack.cli.common import db_path, parse_output_file, parse_seconds, parse_skip, print_json
from rankpack.cli.run_cmd import (
    add_plan_arguments,
    add_run_arguments,
    run_one,
    submission_from_args,
)
from rankpack.controller.views import SimView
from rankpack.errors import UserError
from rankpack.profile.sampling import DEFAULT_SAMPLE_S, ProfileSummary, sample_live, summarise
from rankpack.profile.tracker import DutyTracker
from rankpack.report.tables import print_summary_table
from rankpack.store import Store


def _case_parser(defaults: argparse.Namespace) -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="rankpack profile CASE")
    add_plan_arguments(p)
    add_run_arguments(p)
    p.add_argument("--seconds", type=parse_seconds, help="stop the run after this long")
    p.add_argument("--skip", type=parse_skip, default=0.1)
    p.add_argument("--plot", type=parse_output_file)
    p.add_argument("--json", action="store_true")
    # options given before CASE count too
    p.set_defaults(**{k: v for k, v in vars(defaults).items() if v not in (None, False)})
    return p


def _output(summary: ProfileSummary, args: argparse.Namespace, title: str, **extra: object) -> None:
    if args.plot:
        from rankpack.profile.plot import plot_duty

        plot_duty(summary, args.plot, title=title)
    if args.json:
        out = summary.to_json()
        out.update(extra)
        out["wait_mode"] = args.wait
        print_json(out)
    else:
        print_summary_table(
            summary, len(summary.ranks), "openmpi", args.wait, extra.get("exit_code"),  # type: ignore[arg-type]
            Path(str(extra.get("run_dir", ""))),
        )  # fmt: skip


def handle_case(args: argparse.Namespace) -> int:
    case, *rest = args.program
    cargs = _case_parser(args).parse_args(rest)
    cargs.case = case
    if cargs.seconds is not None and cargs.seconds <= 0:
        raise UserError(f"--seconds must be positive (got {cargs.seconds:g})")
    if not 0 <= cargs.skip < 1:
        raise UserError(f"--skip must be in [0, 1) (got {cargs.skip})")
    sub = submission_from_args(cargs)
    backend = LocalBackend(use_cgroups=not cargs.no_cgroups)
    follower = _DutyFollower(sub.n_ranks, cargs.skip)
    stop = threading.Event()
    timer = threading.Timer(cargs.seconds, stop.set) if cargs.seconds else None
    if timer:
        timer.start()
    try:
        result = run_one(
            sub, backend, Store(db_path(args)), show=False, stop=stop, wait_mode=cargs.wait,
            label="profile", extra={"profile": True}, display=follower,
        )  # fmt: skip
    finally:
        if timer:
            timer.cancel()
    follower.take(result.run_dir)
    tracker = follower.tracker
    if tracker is None:
        raise UserError(f"the run {result.id} ended before the shim published anything")
    summary = tracker.summary([float(r.cpu_millis) for r in sub.plan().ranks])
    tracker.close()
    _output(
        summary, cargs, f"Per-rank duty cycle: {result.case}",
        run_id=result.id, status=result.status, iterations=result.iterations,
        exit_code=result.exit_code, run_dir=result.run_dir,
    )  # fmt: skip
    return 0 if result.status in ("completed", "interrupted") else 1


class _DutyFollower:
    """A display that keeps every new shim record of the run (for the steady-state duty)."""

    def __init__(self, n_ranks: int, skip: float) -> None:
        self.n_ranks = n_ranks
        self.skip = skip
        self.tracker: DutyTracker | None = None

    def take(self, run_dir: str | None) -> None:
        if run_dir is None:
            return
        if self.tracker is None:
            self.tracker = DutyTracker(shim_dir(Path(run_dir)), self.n_ranks, self.skip)
        self.tracker.live()

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        for sim in sims:
            self.take(sim.run_dir)

    def close(self) -> None:
        pass


def handle_attach(args: argparse.Namespace) -> int:
    db = db_path(args)
    if not db.exists():  # reading must not create a database
        raise UserError(f"no run with id {args.attach}: database {db} does not exist")
    store = Store(db)
    run = store.get_run(args.attach)
    if run.status != "running":
        raise UserError(f"run {args.attach} is {run.status}, not running; see `rankpack runs show`")
    live = shim_dir(Path(run.run_dir))
    if not live.is_dir():
        raise UserError(f"run {args.attach} was started without the shim (--no-shim)")
    if args.seconds is None:
        args.seconds = DEFAULT_SAMPLE_S
    if args.seconds <= 0:
        raise UserError(f"--seconds must be positive (got {args.seconds:g})")

    def ended(timeout_s: float) -> bool:
        time.sleep(timeout_s)
        return store.get_run(args.attach).status != "running"

    history = sample_live(live, run.n_ranks, seconds=args.seconds, wait_for_exit=ended)
    requests = [float(r.cpu_millis) for r in run.ranks]
    summary = summarise(history, requests, args.skip)
    args.wait = run.options.get("wait_mode", "spin")
    _output(summary, args, f"Per-rank duty cycle: run {args.attach}", run_id=args.attach,
            run_dir=run.run_dir, exit_code=None)  # fmt: skip
    return 0
