"""`rankpack profile -- PROGRAM ARGS`: run an MPI program under the PMPI shim, sample its
ranks' live records and print per-rank duty cycles and reclaimable CPU (seed 001 §3).

The sampling and summarising live in `rankpack.profile.sampling`, so the case form
(`rankpack profile CASE`, wired with the run driver) reuses them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from rankpack.cli.common import (
    parse_id,
    parse_millis,
    parse_output_dir,
    parse_output_file,
    parse_ranks,
    parse_seconds,
    parse_skip,
    print_json,
)
from rankpack.core.actions import WAIT_MODES
from rankpack.errors import UserError
from rankpack.profile.sampling import DEFAULT_SAMPLE_S, sample_live, summarise
from rankpack.profile.shim import shim_env
from rankpack.report.tables import print_summary_table


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "profile",
        help="per-rank MPI duty cycles of a case, a program, or a running run (PMPI shim)",
        description=(
            "Run an OpenFOAM CASE (options of `rankpack run` may follow it) or any MPI "
            "PROGRAM (after --) with the rankpack PMPI shim preloaded, or --attach to a "
            "`rankpack run` in progress; sample every rank's live record about once a second "
            "and report the steady-state duty cycle (compute / (compute + MPI)), the times "
            "and the reclaimable CPU r(1-d) per rank, as a table, --json, and a --plot PNG. "
            "Examples: rankpack profile pitzDaily --ranks 4 --iterations 100; "
            "rankpack profile --ranks 4 --seconds 10 -- ./my_mpi_app args; "
            "rankpack profile --attach 12 --seconds 5"
        ),
    )
    p.add_argument(
        "--ranks", type=parse_ranks, default=None, help="number of MPI ranks (default 4)"
    )
    p.add_argument(
        "--seconds",
        type=parse_seconds,
        default=None,
        help="stop after this long (default: a program or --attach 10 s, a CASE runs to its end)",
    )
    p.add_argument("--mpi", choices=["openmpi", "mpich"], default="openmpi", help="MPI flavour")
    p.add_argument(
        "--wait", choices=list(WAIT_MODES), default="spin", help="shim wait mode (default spin)"
    )
    p.add_argument(
        "--request",
        type=parse_millis,
        default=1000,
        metavar="MILLIS",
        help="CPU request of every rank, r_i in c_i = r_i(1-d_i) (default 1000m)",
    )
    p.add_argument(
        "--skip",
        type=parse_skip,
        default=0.1,
        metavar="FRACTION",
        help="initial fraction of the run left out of the steady state (default 0.1)",
    )
    p.add_argument(
        "--workdir",
        type=parse_output_dir,
        default=None,
        help="working directory of the ranks (default: a new temporary directory)",
    )
    p.add_argument(
        "--trace", type=parse_output_dir, default=None, metavar="DIR", help="write per-call CSVs"
    )
    p.add_argument("--no-cgroups", action="store_true", help="do not put ranks in cgroups")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--plot", type=parse_output_file, default=None, metavar="PNG", help="bar chart (Fig. 1)"
    )
    p.add_argument(
        "--attach",
        type=parse_id,
        metavar="RUN_ID",
        help="profile a `rankpack run` that is running now (for --seconds) instead",
    )
    p.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        metavar="CASE | -- PROGRAM [ARGS...]",
        help="an OpenFOAM case directory or tutorial name (options of `rankpack run` may "
        "follow it, plus --iterations/--seconds), or any MPI program after --",
    )
    p.set_defaults(handler=handle)


def _resolve_program(argv: list[str]) -> tuple[str, ...]:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserError(
            "no program given; put it after --, e.g. rankpack profile --ranks 4 -- ./app"
        )
    exe = argv[0]
    found = os.path.abspath(exe) if "/" in exe else shutil.which(exe)
    if not found or not os.access(found, os.X_OK):
        raise UserError(f"program '{exe}' not found or not executable")
    return (found, *argv[1:])


def handle(args: argparse.Namespace) -> int:
    from rankpack.cli.profile_case import handle_attach, handle_case

    if args.attach is not None:
        return handle_attach(args)
    if args.program and args.program[0] != "--":
        return handle_case(args)
    return handle_program(args)


def handle_program(args: argparse.Namespace) -> int:
    from rankpack.backend.local import LocalBackend
    from rankpack.backend.protocol import RankResources, SimSpec

    if args.seconds is None:
        args.seconds = DEFAULT_SAMPLE_S
    if args.ranks is None:
        raise UserError(
            "--ranks is required with a program, e.g. rankpack profile --ranks 4 -- ./app"
        )
    if args.ranks < 1:
        raise UserError(f"--ranks must be at least 1 (got {args.ranks})")
    if args.seconds <= 0:
        raise UserError(f"--seconds must be positive (got {args.seconds})")
    if not 0 <= args.skip < 1:
        raise UserError(f"--skip must be in [0, 1) (got {args.skip})")
    command = _resolve_program(list(args.program))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rankpack-profile-"))
    if not workdir.is_dir():
        raise UserError(f"--workdir {workdir} is not a directory")
    live_dir = Path(tempfile.mkdtemp(prefix="rankpack-live-", dir=_live_root()))
    env = shim_env(live_dir, args.wait, args.trace, flavour=args.mpi)
    requests = [float(args.request)] * args.ranks
    spec = SimSpec(
        sim_id=f"profile-{os.getpid()}",
        case_dir=workdir.resolve(),
        command=command,
        ranks=tuple(RankResources(args.request) for _ in range(args.ranks)),
        log_path=workdir.resolve() / "profile.log",
        env=env,
        mpi=args.mpi,
    )
    backend = LocalBackend(use_cgroups=not args.no_cgroups)
    backend.launch(spec)

    def ended(timeout_s: float) -> bool:
        backend.wait(timeout_s)
        return backend.observe(spec.sim_id).phase.ended

    try:
        history = sample_live(live_dir, args.ranks, seconds=args.seconds, wait_for_exit=ended)
        exit_code = backend.observe(spec.sim_id).exit_code
    finally:
        backend.release(spec.sim_id)
        shutil.rmtree(live_dir, ignore_errors=True)
    if not any(history.values()):
        raise UserError(
            f"no rank published a live record (exit code {exit_code}); "
            f"is it an MPI program built with {args.mpi}? See {spec.log_path}"
        )
    summary = summarise(history, requests, args.skip)
    if args.plot:
        from rankpack.profile.plot import plot_duty

        plot_duty(summary, args.plot, title=f"Per-rank duty cycle: {Path(command[0]).name}")
    if args.json:
        out = summary.to_json()
        out["exit_code"] = exit_code
        out["wait_mode"] = args.wait
        print_json(out)
    else:
        print_summary_table(summary, args.ranks, args.mpi, args.wait, exit_code, spec.log_path)
    return 0


def _live_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None
