"""`rankpack submit` puts a simulation in the queue; `rankpack queue` lists the queue."""

from __future__ import annotations

import argparse
from dataclasses import replace

from rich.console import Console

from rankpack.case.openfoam import resolve_case
from rankpack.cli.common import (
    db_path,
    parse_cores,
    parse_iterations,
    parse_list,
    parse_millis,
    parse_ranks,
    parse_submit_count,
    phases_from_text,
    print_json,
    print_listing,
)
from rankpack.cli.operator_cmd import (
    add_cluster_arguments,
    add_read_backend,
    create_simulations,
    handle_queue_kubernetes,
)
from rankpack.cli.run_cmd import parse_center
from rankpack.core.actions import WAIT_SETTINGS
from rankpack.errors import UserError
from rankpack.plan.allocation import budget_to_millis, resolve_weights
from rankpack.plan.submission import Submission, validate
from rankpack.store import QueueRow, Store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "submit",
        help="queue a simulation for `rankpack multiplex` (--backend kubernetes: a Simulation "
        "resource for `rankpack operator`)",
        description="Queue CASE (case directory or tutorial name); `rankpack multiplex` runs "
        "the queue. Requests only: the multiplexer resizes ranks from measured duty cycles. "
        "With --backend kubernetes, create Simulation resources instead; `rankpack "
        "operator` runs them.",
    )
    p.add_argument("case", metavar="CASE")
    p.add_argument("--ranks", type=parse_ranks, default=4, help="MPI ranks (default 4)")
    p.add_argument("--weights", type=parse_list, help="initial per-rank weights (default equal)")
    p.add_argument(
        "--budget",
        type=parse_cores,
        help="CPU requests of this simulation in cores (default: one per rank); sizing and "
        "fairness never exceed it",
    )
    p.add_argument("--floor", type=parse_millis, default=0, metavar="MILLIS")
    p.add_argument("--iterations", type=parse_iterations, help="stop after K time steps")
    p.add_argument("--decompose", choices=["equal", "weighted", "concentric"], default="equal")
    p.add_argument("--center", help="X,Y,Z for --decompose concentric")
    p.add_argument(
        "--phases",
        help="phase schedule replacing duty-cycle sizing: FRACTION:R0,R1,..;FRACTION:.. "
        "e.g. 0:500,500,1200,1800;0.34:1000,1000,1000,1000 (millicores by progress)",
    )
    p.add_argument(
        "--count", type=parse_submit_count, default=1, help="queue this many copies (default 1)"
    )
    p.add_argument(
        "--solver", help="the solver to run, a command name (default: the case's controlDict "
        "application)",
    )  # fmt: skip
    p.add_argument(
        "--wait", choices=WAIT_SETTINGS,
        help="how its ranks wait inside MPI (default: the multiplexer's or operator's --wait)",
    )  # fmt: skip
    p.add_argument(
        "--backend", choices=["local", "kubernetes"], default="local",
        help="local (default): this machine's queue, run by `rankpack multiplex`; kubernetes: "
        "create Simulation resources, run by `rankpack operator`",
    )  # fmt: skip
    add_cluster_arguments(p)
    p.add_argument("--volume", help="kubernetes: where the case lives in the pods "
                   "(pvc:CLAIM[:MOUNT_PATH] or host:DIR)")  # fmt: skip
    p.add_argument(
        "--image", help="kubernetes: what its ranks, mpirun and staging's OpenFOAM run (spec."
        "image; default: the operator's rank image; the admin's --allow-image bounds it)",
    )  # fmt: skip
    p.add_argument(
        "--pull-secret", action="append", default=[], metavar="NAME",
        help="kubernetes: a Secret of the namespace that pulls --image (repeat for several)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=handle_submit)

    q = sub.add_parser(
        "queue",
        help="list queued (and with --all, past) simulations; cancel or requeue entries "
        "(--backend kubernetes: Queued and Running Simulations)",
        description="Without a sub-command: list the queue. `queue cancel ID...` takes "
        "queued entries out; `queue requeue ID...` puts failed, interrupted or cancelled "
        "entries back.",
    )
    q.add_argument("--all", action="store_true", help="include launched and finished entries")
    add_read_backend(q, "the Simulations of a namespace (Queued and Running; --all: every one)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=handle_queue)
    actions = q.add_subparsers(dest="queue_command", metavar="{cancel,requeue}",
                               parser_class=type(q))  # fmt: skip
    for name, text in (
        ("cancel", "take queued entries out of the queue"),
        ("requeue", "put failed, interrupted or cancelled entries back"),
    ):
        a = actions.add_parser(name, help=text)
        a.add_argument("ids", type=int, nargs="+", metavar="ID")
        a.add_argument("--json", action="store_true")
        a.set_defaults(handler=handle_queue_change, queue_command=name)


def submission_from_args(args: argparse.Namespace) -> Submission:
    """The submission `submit` queues (or creates as Simulations), validated by
    `rankpack.plan.submission.validate`; the case must exist here."""
    weights = resolve_weights(args.weights, args.ranks, args.weights is None)
    budget = budget_to_millis(args.budget if args.budget is not None else float(len(weights)))
    sub = Submission(
        case=args.case,
        weights=tuple(weights),
        budget_millis=budget,
        floor_millis=args.floor,
        iterations=args.iterations,
        decompose=args.decompose,
        center=parse_center(args.center),
        phases=phases_from_text(args.phases, len(weights)) if args.phases else (),
        solver=args.solver or None,
        wait=args.wait,
        image=getattr(args, "image", None) or None,
        pull_secrets=tuple(getattr(args, "pull_secret", ())),
    )
    if (sub.image or sub.pull_secrets) and args.backend != "kubernetes":
        raise UserError("--image and --pull-secret are for --backend kubernetes (a local run "
                        "uses this machine's OpenFOAM)")  # fmt: skip
    validate(sub)
    if args.count < 1:
        raise UserError(f"--count must be at least 1, got {args.count}")
    source = resolve_case(args.case)
    return replace(sub, case=str(source.path) if not source.tutorial else source.name)


def handle_submit(args: argparse.Namespace) -> int:
    sub = submission_from_args(args)
    if args.backend == "kubernetes":
        names = create_simulations(args, sub, args.count, args.volume)
        if args.json:
            print_json({"simulations": names, "submission": sub.to_json()})
        else:
            Console().print(
                f"created Simulation {', '.join(names)}: {sub.case}, {sub.n_ranks} ranks, "
                f"initial requests {' '.join(f'{m}m' for m in sub.initial_millis)}"
            )
        return 0
    store = Store(db_path(args))
    ids = store.submit_many(sub.case, sub.n_ranks, sub.to_json(), args.count)
    if args.json:
        print_json({"queued": ids, "submission": sub.to_json()})
    else:
        Console().print(
            f"queued {', '.join(map(str, ids))}: {sub.case}, {sub.n_ranks} ranks, "
            f"initial requests {' '.join(f'{m}m' for m in sub.initial_millis)}"
        )
    return 0


def handle_queue(args: argparse.Namespace) -> int:
    if getattr(args, "backend", "local") == "kubernetes":
        return handle_queue_kubernetes(args)
    statuses = (
        ("queued", "running", "completed", "failed", "interrupted") if args.all else ("queued",)
    )
    store = Store.open_existing(db_path(args))
    rows = store.queue(statuses) if store is not None else []

    def cells(r: QueueRow) -> list[str]:
        sub = Submission.from_json(r.options)
        return [
            str(r.id), r.submitted_at.replace("T", " ")[:19], r.case_name,
            str(r.n_ranks), " ".join(f"{m}m" for m in sub.initial_millis),
            str(sub.iterations or "endTime"), r.status, str(r.run_id or "-"),
        ]  # fmt: skip

    return print_listing(
        args.json,
        [r.to_json() for r in rows],
        "the queue is empty; add simulations with `rankpack submit CASE`",
        "queue",
        ("id", "submitted", "case", "ranks", "initial requests", "iterations", "status", "run"),
        lambda: map(cells, rows),
    )


def handle_queue_change(args: argparse.Namespace) -> int:
    store = Store(db_path(args), create=False)
    known = {i for i in args.ids if store.get_queue(i) is not None}
    missing = sorted(set(args.ids) - known)
    if missing:
        raise UserError(
            f"no queue entry {', '.join(map(str, missing))}; see `rankpack queue --all`"
        )
    if args.queue_command == "cancel":
        moved = store.set_queue_status(args.ids, "cancelled", ("queued",))
    else:
        moved = store.set_queue_status(args.ids, "queued", ("failed", "interrupted", "cancelled"))
    skipped = [i for i in args.ids if i not in moved]
    for qid in moved:
        store.add_event(None, f"queue-{args.queue_command}", {"queue_id": qid})
    if args.json:
        print_json({args.queue_command: moved, "unchanged": skipped})
    else:
        Console().print(
            f"{args.queue_command}: {', '.join(map(str, moved)) or 'none'}"
            + (f"; unchanged (not in a state that allows it): {skipped}" if skipped else "")
        )
    return 0 if moved else 1
