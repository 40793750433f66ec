"""`rankpack profile CASE ...` (run an OpenFOAM case with the shim and report duty cycles)
and `rankpack profile --attach RUN_ID` (read the live records of a running `rankpack run`)."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from rankpack.backend.local import LocalBackend
from rankpack.cli import OneLineArgumentParser
from rankpack.cli.common import db_path, parse_output_file, parse_seconds, parse_skip, print_json
from rankpack.cli.profile_cmd import DEFAULT_SECONDS, print_summary_table
from rankpack.cli.run_cmd import add_plan_arguments, add_run_arguments, options_from_args
from rankpack.controller.single import DutySource, attach_shim, execute, prepare
from rankpack.errors import UserError
from rankpack.profile.sampling import ProfileSummary, sample_live, summarise
from rankpack.profile.tracker import DutyTracker
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
    options = options_from_args(cargs, label="profile")
    backend = LocalBackend(use_cgroups=not cargs.no_cgroups)
    from rankpack.cli.common import data_dir

    prepared = prepare(options, data_dir() / "runs")
    prepared, factory = attach_shim(prepared, cargs.wait)
    trackers: list[DutySource] = []

    def keep(run_dir: Path) -> DutySource:
        tracker = factory(run_dir)
        trackers.append(tracker)
        return tracker

    stop = threading.Event()
    timer = threading.Timer(cargs.seconds, stop.set) if cargs.seconds else None
    if timer:
        timer.start()
    try:
        result = execute(
            backend, Store(db_path(args)), prepared, cgroups=backend.cgroup_version, stop=stop,
            duty_source=keep, extra={"shim": True, "wait_mode": cargs.wait, "profile": True},
        )  # fmt: skip
    finally:
        if timer:
            timer.cancel()
    tracker = trackers[0]
    assert isinstance(tracker, DutyTracker)
    tracker.skip_fraction = cargs.skip
    summary = tracker.summary([float(r.cpu_millis) for r in options.plan.ranks])
    _output(
        summary, cargs, f"Per-rank duty cycle: {prepared.source.name}",
        run_id=result.id, status=result.status, iterations=result.iterations,
        exit_code=result.exit_code, run_dir=result.run_dir,
    )  # fmt: skip
    return 0 if result.status in ("completed", "interrupted") else 1


def handle_attach(args: argparse.Namespace) -> int:
    db = db_path(args)
    if not db.exists():  # reading must not create a database
        raise UserError(f"no run with id {args.attach}: database {db} does not exist")
    store = Store(db)
    run = store.get_run(args.attach)
    if run["status"] != "running":
        raise UserError(
            f"run {args.attach} is {run['status']}, not running; see `rankpack runs show`"
        )
    live = Path(run["run_dir"]) / ".rankpack" / "shim"
    if not live.is_dir():
        raise UserError(f"run {args.attach} was started without the shim (--no-shim)")
    if args.seconds is None:
        args.seconds = DEFAULT_SECONDS
    if args.seconds <= 0:
        raise UserError(f"--seconds must be positive (got {args.seconds:g})")

    def ended(timeout_s: float) -> bool:
        time.sleep(timeout_s)
        return bool(store.get_run(args.attach)["status"] != "running")

    history = sample_live(live, run["n_ranks"], seconds=args.seconds, wait_for_exit=ended)
    requests = [float(r["cpu_millis"]) for r in run["ranks"]]
    summary = summarise(history, requests, args.skip)
    args.wait = run["options"].get("wait_mode", "spin")
    _output(summary, args, f"Per-rank duty cycle: run {args.attach}", run_id=args.attach,
            run_dir=run["run_dir"], exit_code=None)  # fmt: skip
    return 0
