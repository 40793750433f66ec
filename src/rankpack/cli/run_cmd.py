"""`rankpack run`: one OpenFOAM case, each MPI rank in its own cgroup with its planned CPU."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from rich.console import Console

from rankpack.backend.local import LocalBackend
from rankpack.case import decomposition
from rankpack.case.openfoam import resolve_case
from rankpack.cli.common import (
    data_dir,
    db_path,
    parse_cores,
    parse_iterations,
    parse_list,
    parse_millis,
    parse_ranks,
    parse_workdir,
    print_json,
)
from rankpack.controller.single import (
    RunOptions,
    attach_shim,
    check_options,
    execute,
    prepare,
)
from rankpack.plan.allocation import QoS, budget_to_millis, make_plan, resolve_weights
from rankpack.profile.shim import shim_library
from rankpack.report.live import RunDisplay
from rankpack.report.results import RunResult
from rankpack.report.tables import run_table
from rankpack.store import Store


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=parse_ranks, default=4, help="number of MPI ranks (default 4)")
    p.add_argument(
        "--weights", type=parse_list, help="per-rank weights: 1,1,5,15 or grouped 8x1,4x5,4x15"
    )
    p.add_argument(
        "--budget", type=parse_cores, help="total CPU request in cores (default: one per rank)"
    )
    p.add_argument(
        "--floor", type=parse_millis, default=0, metavar="MILLIS", help="minimum request per rank"
    )


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--qos",
        choices=[q.value for q in QoS],
        default=QoS.REQUESTS.value,
        help="requests (default): CPU requests only, ranks may use idle CPU; "
        "limits: also hard quotas (refused without --allow-limits: CFS throttling at MPI "
        "barriers multiplies wall time)",
    )
    p.add_argument("--allow-limits", action="store_true", help="accept --qos limits")
    p.add_argument(
        "--iterations",
        type=parse_iterations,
        help="stop after K time steps (default: the case's endTime)",
    )
    p.add_argument(
        "--decompose",
        choices=["equal", "weighted", "concentric"],
        default="equal",
        help="domain decomposition (default equal); weighted/concentric follow --weights",
    )
    p.add_argument(
        "--decompose-weights",
        type=parse_list,
        metavar="WEIGHTS",
        help="weights for the decomposition only (default: the same as --weights)",
    )
    p.add_argument("--center", help="X,Y,Z centre for --decompose concentric")
    p.add_argument(
        "--workdir", type=parse_workdir, help="run directory (default: a new one under data dir)"
    )
    p.add_argument(
        "--no-shim",
        action="store_true",
        help="do not load the PMPI shim (no duty cycles are measured)",
    )
    p.add_argument(
        "--wait",
        choices=["spin", "polite", "adaptive"],
        default="spin",
        help="how ranks wait inside MPI (shim): spin (MPI's own, default), polite (sleep, "
        "gives the CPU back), adaptive",
    )
    p.add_argument(
        "--no-cgroups",
        action="store_true",
        help="run uncontained (no per-rank CPU control; CPU-seconds then come from /proc "
        "samples, a lower bound); recorded as such",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="run an OpenFOAM case with per-rank CPU requests on this machine",
        description=(
            "Copy CASE (a case directory or an installed tutorial name such as pitzDaily or "
            "aerofoilNACA0012) into a fresh run directory, mesh and decompose it, and run its "
            "solver with mpirun, each rank in its own cgroup with a CPU request from the plan. "
            "Results go to the SQLite database (see `rankpack runs`)."
        ),
    )
    p.add_argument("case", metavar="CASE", help="case directory or tutorial name")
    add_plan_arguments(p)
    add_run_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=handle)


def parse_center(text: str | None) -> tuple[float, float, float] | None:
    return None if text is None else decomposition.parse_center(text)


def options_from_args(args: argparse.Namespace, *, label: str | None = None) -> RunOptions:
    weights = resolve_weights(args.weights, args.ranks, args.weights is None)
    budget = budget_to_millis(args.budget if args.budget is not None else float(len(weights)))
    plan = make_plan(weights, budget, floor_millis=args.floor, qos=QoS(args.qos))
    options = RunOptions(
        case=args.case,
        plan=plan,
        iterations=args.iterations,
        decompose=args.decompose,
        decompose_weights=(
            resolve_weights(args.decompose_weights, args.ranks, False)
            if args.decompose_weights
            else None
        ),
        center=parse_center(args.center),
        workdir=args.workdir,
        label=label,
    )
    check_options(options, args.allow_limits)
    return options


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Ctrl-C and SIGTERM ask the driver to stop; it then cleans up and records the run."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_one(
    options: RunOptions,
    backend: LocalBackend,
    store: Store | Callable[[], Store],
    *,
    show: bool,
    stop: threading.Event,
    shim: bool = True,
    wait_mode: str = "spin",
) -> RunResult:
    """Prepare and execute one run. ``store`` may be a factory, so that bad input found
    while preparing leaves no database behind."""
    if shim:
        shim_library("openmpi")  # fail before preparing anything if it is not built
    prepared = prepare(options, data_dir() / "runs")
    duty_source = None
    extra: dict[str, object] = {"shim": shim}
    if shim:
        prepared, duty_source = attach_shim(prepared, wait_mode)
        extra["wait_mode"] = wait_mode
    db = store if isinstance(store, Store) else store()
    title = f"{prepared.source.name} ({prepared.solver}, {options.plan.n_ranks} ranks)"
    display = RunDisplay(title) if show else None
    return execute(
        backend,
        db,
        prepared,
        cgroups=backend.cgroup_version,
        display=display,
        stop=stop,
        duty_source=duty_source,
        extra=extra,
    )


def handle(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    resolve_case(options.case)
    path = db_path(args)
    backend = LocalBackend(use_cgroups=not args.no_cgroups)
    with stop_on_signals() as stop:
        result = run_one(
            options,
            backend,
            lambda: Store(path),
            show=not args.json,
            stop=stop,
            shim=not args.no_shim,
            wait_mode=args.wait,
        )
    if args.json:
        print_json(result.to_json())
    else:
        Console().print(run_table(result))
        if result.message:
            Console(stderr=True).print(f"[yellow]{result.status}: {result.message}")
    return {"completed": 0, "interrupted": 130}.get(result.status, 1)
