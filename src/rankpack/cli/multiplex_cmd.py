"""`rankpack multiplex` runs the queue with the multiplexing controller;
`rankpack events` shows what it decided and why."""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rankpack.backend.local import LocalBackend
from rankpack.cli.common import (
    data_dir,
    db_path,
    parse_concurrent,
    parse_cores,
    parse_id,
    parse_output_file,
    parse_seconds,
    print_json,
    print_listing,
)
from rankpack.cli.operator_cmd import add_read_backend, handle_events_kubernetes
from rankpack.cli.run_cmd import stop_on_signals
from rankpack.controller.baselines import measure_baselines
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import StoreQueue
from rankpack.controller.loop import preview
from rankpack.controller.session import (
    GateChoice,
    SessionResult,
    choose_gate,
    run_session,
)
from rankpack.controller.tracked import LoopSettings
from rankpack.core.actions import WAIT_SETTINGS, StageJob
from rankpack.errors import UserError
from rankpack.plan.allocation import budget_to_millis
from rankpack.plan.submission import Submission
from rankpack.report.gain import gain_lines
from rankpack.report.multiplex_live import MultiplexLive
from rankpack.report.timeline import plot_timeline
from rankpack.store import EventRow, QueueRow, Store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "multiplex",
        help="run the queue: profile, resize in place, pack more simulations, keep them fair",
        description=(
            "Run the queued simulations (see `rankpack submit`) on this machine until the "
            "queue is empty. Each simulation is profiled by the PMPI shim once past its "
            "start-up, its ranks are resized in place to their measured duty cycles, and the "
            "next queued simulation is launched when it fits the unrequested capacity and the "
            "throughput model predicts a gain. Progress rates are kept fair with bounded "
            "adjustments. Ctrl-C stops cleanly."
        ),
    )
    p.add_argument(
        "--max-concurrent", type=parse_concurrent, default=4, help="simulations at once (default 4)"
    )
    p.add_argument(
        "--budget", type=parse_cores, help="CPU requests of all simulations together, cores "
        "(default: this machine's CPUs)"
    )  # fmt: skip
    p.add_argument(
        "--wait",
        choices=WAIT_SETTINGS,
        default="auto",
        help="how ranks wait inside MPI (PMPI shim): auto (default: a simulation spins while "
        "every rank on its nodes has a core to itself, or a node's ranks are all its own in one "
        "cgroup, and is switched live to polite where more ranks outnumber a node's cores; "
        "see docs/controller.md), or a fixed mode for all: "
        "spin, polite, adaptive",
    )
    p.add_argument(
        "--baseline",
        choices=["auto", "db", "measure", "none"],
        default="auto",
        help="single-run times for the co-location gain, from runs alone with the same "
        "settings that started as the queued ones will (at learned sizes, or profiled): "
        "recorded runs (db), run each distinct simulation alone first (measure; after a "
        "first run that learns its sizes when none are), db then measure what is missing "
        "(auto, default)",
    )
    p.add_argument(
        "--profile-s", type=parse_seconds, default=5.0, help="profiling window (default 5 s)"
    )
    p.add_argument(
        "--beta",
        type=float,
        help="gate launches with seed 001's linear contention model and this coefficient "
        "(eq. 5); implies --gate beta",
    )
    p.add_argument(
        "--gate",
        choices=["auto", "limit", "duty", "beta", "off"],
        default="auto",
        help="launch gate: limit (auto, the default): the physical limit of co-location "
        "times the efficiency recorded sessions of the same workload reached (else this "
        "machine's other sessions; 0.6 before any); "
        "duty: the duty-cycle overlap model; beta: the linear model with beta fitted from "
        "recorded sessions; off: launch whenever --max-concurrent allows, shrinking everyone's "
        "requests in proportion when the next does not fit (measures what co-location does)",
    )
    p.add_argument(
        "--plot", type=parse_output_file, help="timeline PNG (default: next to the run directories)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the first decisions, apply none")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=handle_multiplex)

    e = sub.add_parser(
        "events",
        help="the controller's recorded decisions and their reasons (--backend kubernetes: "
        "the operator's Events on Simulations)",
    )
    e.add_argument("--sim", type=parse_id, metavar="RUN_ID", help="only this simulation (run id)")
    e.add_argument("--multiplex", type=parse_id, metavar="ID", help="only this multiplex session")
    add_read_backend(e, "the operator's Events on the Simulations of a namespace")
    e.add_argument("--simulation", metavar="NAME", help="kubernetes: only this Simulation")
    e.add_argument("--json", action="store_true")
    e.set_defaults(handler=handle_events)


@dataclass(frozen=True)
class MultiplexOptions:
    """What `rankpack multiplex` is asked for; the defaults are its command-line defaults
    (`rankpack demo` runs the queue with these)."""

    max_concurrent: int = 4
    budget_cores: float | None = None
    """Requests of all simulations together (None: this machine's CPUs)."""
    wait: str = "auto"
    baseline: str = "auto"
    profile_s: float = 5.0
    beta: float | None = None
    gate: str = "auto"
    plot: Path | None = None
    """Timeline PNG (None: next to the run directories)."""


@dataclass(frozen=True)
class MultiplexOutcome:
    result: SessionResult
    timeline_png: Path
    gate: GateChoice
    """How launches were gated."""

    def to_json(self) -> dict[str, Any]:
        data = self.result.to_json()
        data["timeline_png"] = str(self.timeline_png)
        g = self.gate
        data["gate"] = {"model": g.gate, "colocation_efficiency": g.efficiency,
                        "beta": g.beta, "source": g.source}  # fmt: skip
        return data


def handle_multiplex(args: argparse.Namespace) -> int:
    options = MultiplexOptions(
        max_concurrent=args.max_concurrent, budget_cores=args.budget, wait=args.wait,
        baseline=args.baseline, profile_s=args.profile_s, beta=args.beta, gate=args.gate,
        plot=args.plot,
    )  # fmt: skip
    check_options(options)
    store = Store(db_path(args))
    if args.dry_run:
        requeue(store)
        queue = queued(store)
        backend = LocalBackend()
        capacity, controller, _ = _controller(store, options, queue, backend, quiet=args.json)
        settings = LoopSettings(
            runs_root=data_dir() / "runs", controller=controller, wait_mode=options.wait,
            capacity_millis=capacity,
        )  # fmt: skip
        return dry_run(store, backend, settings, args.json)
    with stop_on_signals() as stop:
        outcome = run_multiplex(store, LocalBackend(), options, show=not args.json, stop=stop)
    if outcome is None:
        return 130
    data = outcome.to_json()
    if args.json:
        print_json(data)
    else:
        print_summary(data)
    result = outcome.result
    if result.status == "interrupted":
        return 130
    ok = all(s.status == "completed" for s in result.simulations) and not result.launch_failures
    return 0 if ok else 1


def check_options(options: MultiplexOptions) -> None:
    if options.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be at least 1, got {options.max_concurrent}")
    if options.profile_s <= 0:
        raise UserError(f"--profile-s must be positive, got {options.profile_s:g}")
    if options.beta is not None and options.beta < 0:
        raise UserError(f"--beta must be >= 0, got {options.beta:g}")


def requeue(store: Store) -> None:
    for q in store.requeue_orphans():
        why = f"its session (pid {q.owner_pid}) ended without finishing it"
        store.add_event(None, "requeued", {"queue_id": q.id, "reason": why})


def queued(store: Store) -> list[QueueRow]:
    queue = store.queue()
    if not queue:
        raise UserError("the queue is empty; add simulations with `rankpack submit CASE`")
    return queue


def _controller(
    store: Store, options: MultiplexOptions, queue: list[QueueRow], backend: LocalBackend,
    *, quiet: bool,
) -> tuple[int, ControllerSettings, GateChoice]:  # fmt: skip
    capacity = (
        budget_to_millis(options.budget_cores)
        if options.budget_cores is not None
        else backend.inventory().allocatable_millis
    )
    gate = choose_gate(
        store, Submission.from_json(queue[0].options), capacity_millis=capacity,
        wait_mode=options.wait, beta=options.beta, gate=options.gate,
    )  # fmt: skip
    if not quiet:
        Console(stderr=True).print(gate.describe())
    controller = gate.settings(
        ControllerSettings(max_concurrent=options.max_concurrent, profile_s=options.profile_s)
    )
    return capacity, controller, gate


def run_multiplex(
    store: Store,
    backend: LocalBackend,
    options: MultiplexOptions,
    *,
    show: bool,
    stop: threading.Event,
) -> MultiplexOutcome | None:
    """Run the store's queue as `rankpack multiplex` does: measure missing single-run
    baselines, run one recorded session, draw its timeline. None if stopped before the
    session started."""
    check_options(options)
    requeue(store)
    queue = queued(store)
    capacity, controller, gate = _controller(store, options, queue, backend, quiet=not show)
    runs_root = data_dir() / "runs"
    settings = LoopSettings(
        runs_root=runs_root, controller=controller, wait_mode=options.wait,
        capacity_millis=capacity,
    )  # fmt: skip
    if options.baseline in ("auto", "measure"):

        def say(sub: Submission, why: str) -> None:
            if show:
                Console(stderr=True).print(
                    f"a first run of {sub.case} alone, to learn the sizes its queued copies "
                    "start at (its baseline then starts from them too) ..."
                    if why == "learn"
                    else f"measuring the single-run baseline of {sub.case} ..."
                )

        # the session's own settings (profiling window, capacity, wait mode), one at a time
        measure_baselines(backend, store, settings, force=options.baseline == "measure",
                          stop=stop, on_measure=say)  # fmt: skip
    if stop.is_set():
        return None
    display = MultiplexLive() if show else None
    result = run_session(
        backend, store, settings, baseline=options.baseline, display=display, stop=stop
    )
    plot = options.plot or runs_root / f"multiplex-{result.multiplex_id}-timeline.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot_timeline(
        store.events(multiplex_id=result.multiplex_id), plot,
        f"rankpack multiplex {result.multiplex_id}: {len(result.simulations)} simulations",
    )  # fmt: skip
    return MultiplexOutcome(result, plot, gate)


def dry_run(store: Store, backend: LocalBackend, settings: LoopSettings, as_json: bool) -> int:
    """The loop's first decision on the queue, applied nowhere: built from the same
    observations as a run (learned sizes, capacity), so it decides as the run will."""
    decision = preview(backend, store, StoreQueue(store, None), settings)
    actions = [{"action": _action_name(a), **a.__dict__} for a in decision.actions]
    if as_json:
        print_json({"dry_run": True, "actions": actions})
    else:
        for a in actions:
            Console().print(f"would {a['action']}: {a}")
        if not actions:
            Console().print("no action now")
    return 0


def _action_name(action: object) -> str:
    """What a dry run calls an action: a queued job the gate lets in is "launch" (claimed,
    staged, then launched: `StageJob`, the first of its two steps), the others their type."""
    return "launch" if isinstance(action, StageJob) else type(action).__name__.lower()


def print_summary(data: dict[str, object]) -> None:
    sims = data["simulations"]
    assert isinstance(sims, list)
    table = Table(title=f"multiplex {data['multiplex_id']}: {data['status']}")
    for col in ("run", "case", "status", "iterations", "wall s", "start s", "end s"):
        table.add_column(col, justify="left" if col in ("case", "status") else "right")
    for s in sims:
        table.add_row(
            str(s["id"]), s["case"], s["status"], f"{s['iterations']}/{s['expected_iterations']}",
            f"{s['wall_s']:.1f}", f"{s['started_s']:.1f}", f"{s['finished_s']:.1f}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    for line in gain_lines(data):
        console.print(line)
    limit = data.get("throughput_limit")
    if isinstance(limit, float):
        console.print(
            f"physical limit of the gain on this capacity (work-conserving, from the single "
            f"runs' duty cycles): {limit:.2f}x"
        )
    fair = data["fairness_ratio"]
    console.print(
        f"fairness (max/min wall): {fair:.2f}" if isinstance(fair, float) else "fairness: -",
        f"resizes: {data['resizes']}, restarts: {data['restarts']}, "
        f"timeline: {data['timeline_png']}",
    )


def handle_events(args: argparse.Namespace) -> int:
    if args.backend == "kubernetes":
        return handle_events_kubernetes(args)
    if args.simulation:
        raise UserError("--simulation NAME needs --backend kubernetes (locally: --sim RUN_ID)")
    store = Store.open_existing(db_path(args))
    events = store.events(run_id=args.sim, multiplex_id=args.multiplex) if store else []

    def cells(e: EventRow) -> list[str]:
        detail = dict(e.detail)
        reason = detail.pop("reason", None)
        text = ", ".join(f"{k}={v}" for k, v in detail.items())
        if reason:
            text = f"{reason}" + (f" ({text})" if text else "")
        return [f"{e.t_s:.1f}", str(e.multiplex_id or "-"), str(e.run_id or "-"), e.kind, text]

    return print_listing(
        args.json,
        [e.to_json() for e in events],
        "no events recorded; they come from `rankpack multiplex`",
        "controller events",
        ("t s", "multiplex", "run", "event", "detail"),
        lambda: map(cells, events),
        right=("t s", "multiplex", "run"),
    )
