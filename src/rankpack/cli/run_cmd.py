"""`rankpack run`: one OpenFOAM case, each MPI rank in its own rank pod with its planned CPU.

A queue of one for the control loop (`rankpack.controller.loop`): the same loop, policy and
backend protocol as `rankpack multiplex`, so a run can follow a phase schedule (`--phases`)
or be sized to its measured duty cycles (`--resize duty`) in place.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from rankpack.backend.protocol import Backend
from rankpack.case import decomposition, staging
from rankpack.cli.backends import add_backend_arguments, make_backend
from rankpack.cli.common import (
    data_dir,
    db_path,
    parse_cores,
    parse_iterations,
    parse_list,
    parse_millis,
    parse_ranks,
    parse_workdir,
    phases_from_text,
    print_json,
)
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.controller.views import Display
from rankpack.core.actions import WAIT_SETTINGS
from rankpack.core.results import RunResult
from rankpack.errors import UserError
from rankpack.plan.allocation import QoS, budget_to_millis, resolve_weights
from rankpack.plan.submission import Submission, validate
from rankpack.profile.shim import FLAVOURS, shim_library
from rankpack.report.live import RunDisplay
from rankpack.report.tables import run_table
from rankpack.store import Store

LIMITS_HAZARD = (
    "hard CPU limits (--qos limits) throttle ranks at MPI barriers and can multiply wall "
    "time by orders of magnitude (1900x measured here on pitzDaily); use the default "
    "--qos requests, or add --allow-limits if you really want quotas"
)


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
        choices=WAIT_SETTINGS,
        default="auto",
        help="how ranks wait inside MPI (PMPI shim): auto (default: spin while every rank on "
        "its node has a core to itself or the node's ranks are all its own in one cgroup, "
        "polite where ranks of this and other simulations outnumber a node's cores; "
        "switched live), or a fixed mode: spin (MPI's own busy "
        "polling), polite (backs off, gives the CPU back), adaptive",
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
            "solver with mpirun, its ranks in one cgroup weighing the plan's CPU requests "
            "(each rank's share of it a nice value). "
            "--phases or --resize duty change the requests in place while it runs (no "
            "restart); --json lists every resize. Results go to the SQLite database (see "
            "`rankpack runs`)."
        ),
    )
    p.add_argument("case", metavar="CASE", help="case directory or tutorial name")
    add_plan_arguments(p)
    add_run_arguments(p)
    p.add_argument(
        "--phases",
        help="phase schedule: FRACTION:R0,R1,..;FRACTION:.. e.g. 0:500,1500;0.5:1500,500 "
        "(per-rank millicores from that fraction of the run on, resized in place)",
    )
    add_backend_arguments(p)
    p.add_argument(
        "--mpi",
        choices=list(FLAVOURS),
        default="openmpi",
        help="the MPI library the solver was built with: openmpi (default; Debian's "
        "OpenFOAM) or mpich (MPICH's hydra launches the ranks, on this machine or in the "
        "rank pods)",
    )
    p.add_argument(
        "--resize",
        choices=["none", "duty"],
        default="none",
        help="none (default): keep the plan's requests; duty: profile the ranks once past "
        "start-up and resize them in place to their measured duty cycles",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=handle)


def parse_center(text: str | None) -> tuple[float, float, float] | None:
    return None if text is None else decomposition.parse_center(text)


def submission_from_args(args: argparse.Namespace) -> Submission:
    """The job `run` (and `demo`, `profile CASE`) hands to the control loop; validated
    (`rankpack.plan.submission.validate`, then the case) before anything is created."""
    if QoS(args.qos) is QoS.LIMITS and not args.allow_limits:
        raise UserError(LIMITS_HAZARD)
    weights = resolve_weights(args.weights, args.ranks, args.weights is None)
    budget = budget_to_millis(args.budget if args.budget is not None else float(len(weights)))
    phases = phases_from_text(args.phases, len(weights)) if getattr(args, "phases", None) else ()
    resize = getattr(args, "resize", "none")
    if phases and resize == "duty":
        raise UserError("--phases and --resize duty both set the requests; give one of them")
    sub = Submission(
        case=args.case,
        weights=tuple(weights),
        budget_millis=budget,
        floor_millis=args.floor,
        iterations=args.iterations,
        decompose=args.decompose,
        decompose_weights=(
            tuple(resolve_weights(args.decompose_weights, args.ranks, False))
            if args.decompose_weights
            else ()
        ),
        center=parse_center(args.center),
        phases=phases,
        qos=args.qos,
        sizing="duty" if resize == "duty" else "fixed",
        workdir=str(args.workdir) if args.workdir else None,
    )
    check_submission(validate(sub))
    return sub


def check_submission(sub: Submission) -> None:
    staging.check(
        staging.StageSpec(
            sim_id="check",
            case=sub.case,
            n_ranks=sub.n_ranks,
            runs_root=data_dir() / "runs",
            iterations=sub.iterations,
            decompose=sub.decompose,
            workdir=Path(sub.workdir) if sub.workdir else None,
        )
    )


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Ctrl-C and SIGTERM ask the loop to stop; it then cleans up and records the run."""
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
    sub: Submission,
    backend: Backend,
    store: Store,
    *,
    show: bool,
    stop: threading.Event,
    shim: bool = True,
    wait_mode: str = "auto",
    label: str | None = None,
    extra: dict[str, object] | None = None,
    controller: ControllerSettings | None = None,
    display: Display | None = None,
    image: str | None = None,
    volume: str | None = None,
    mpi: str = "openmpi",
) -> RunResult:
    """Run one job to its end through the control loop; a case that cannot be staged is a
    UserError (exit 2)."""
    if shim:
        shim_library(mpi)  # fail before anything is created if it is not built
    settings = LoopSettings(
        mpi=mpi,
        runs_root=data_dir() / "runs",
        controller=controller or ControllerSettings(max_concurrent=1),
        shim=shim,
        wait_mode=wait_mode,
        label=label,
        extra=dict(extra or {}),
        image=image,
        volume=volume,
    )
    if show:
        display = RunDisplay(f"{Path(sub.case).name} ({sub.n_ranks} ranks)")
    result = run_jobs(backend, store, OneJob(sub), settings, display=display, stop=stop)
    if result.stage_failures:
        raise UserError(result.stage_failures[0].reason)
    if not result.results:
        raise KeyboardInterrupt
    return result.results[0]


def handle(args: argparse.Namespace) -> int:
    sub = submission_from_args(args)
    backend = make_backend(args, use_cgroups=not args.no_cgroups)
    db = db_path(args)
    new_db = not db.exists()
    store = Store(db)
    try:
        with stop_on_signals() as stop:
            result = run_one(
                sub, backend, store, show=not args.json, stop=stop, shim=not args.no_shim,
                wait_mode=args.wait, image=args.image, volume=args.volume, mpi=args.mpi,
            )  # fmt: skip
    except UserError:
        # Bad input found while staging (e.g. more ranks than cells): nothing ran, so leave
        # no database behind, as when the input is refused before staging.
        if new_db and not store.list_runs(1):
            store.close()
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
        raise
    if args.json:
        data = result.to_json()
        requests = getattr(backend, "api_requests", None)
        if requests is not None:  # the Kubernetes backend: what the run cost the apiserver
            data["api_requests"] = requests()
        print_json(data)
    else:
        Console().print(run_table(result))
        if result.message:
            code = f" ({result.failure})" if result.failure else ""
            Console(stderr=True).print(f"[yellow]{result.status}{code}: {result.message}")
    return {"completed": 0, "interrupted": 130}.get(result.status, 1)
