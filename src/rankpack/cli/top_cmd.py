"""`rankpack top`: a live view of a cluster's Simulations, their ranks and the nodes they
use, through a kubeconfig with its user's own rights (`rankpack.report.top`)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.live import Live

from rankpack.cli.common import parse_seconds, print_json
from rankpack.cli.operator_cmd import _api_error, add_cluster_arguments, simulation_api
from rankpack.cli.run_cmd import stop_on_signals
from rankpack.errors import UserError
from rankpack.report.top import render, top_view

MIN_INTERVAL_S, MAX_INTERVAL_S = 1.0, 3600.0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "top",
        help="live view of a cluster's Simulations, their ranks and nodes (Kubernetes)",
        description=(
            "What each Simulation of a namespace is doing, refreshed every --interval: its "
            "progress and ETA, each rank's request, CPU use, duty (time computing, outside "
            "MPI) and wait mode, its recent resizes and wait-mode switches; and per node "
            "what rankpack's ranks request, use and compute, where the credentials may read "
            "nodes. Reads with the kubeconfig's own rights: what it may not read is not shown."
        ),
    )
    add_cluster_arguments(p)
    p.add_argument("--once", action="store_true", help="print the view once and exit")
    p.add_argument("--json", action="store_true", help="with --once: the view as JSON")
    p.add_argument("--interval", type=parse_seconds, default=5.0, metavar="S",
                   help=f"seconds between refreshes ({MIN_INTERVAL_S:g} to "
                   f"{MAX_INTERVAL_S:g}; default 5)")  # fmt: skip
    p.set_defaults(handler=handle_top)


def read(api: Any) -> tuple[list[Any], list[Any], list[Any] | None]:
    """One round of reads with the credentials' own rights: Simulations (oldest first; an
    `ApiError` when they may not be listed), their Events and the nodes (each left out,
    ``[]``/None, where these credentials may not read it). Also `rankpack.cli.dashboard_cmd`'s."""
    from rankpack.backend.kubernetes.api.kubeapi import ApiError

    sims = api.list()
    try:
        events = api.events()
    except ApiError:
        events = []
    try:
        nodes: list[Any] | None = api.api.list_nodes()
    except ApiError:
        nodes = None
    sims.sort(key=lambda o: str(o["metadata"].get("creationTimestamp", "")))
    return sims, events, nodes


def fetch(api: Any) -> dict[str, Any]:
    """The view from one round of reads (`read`); Simulations that may not be listed are a
    `UserError`."""
    from rankpack.backend.kubernetes.api.kubeapi import ApiError

    try:
        return top_view(*read(api))
    except ApiError as exc:
        raise _api_error(exc, "cannot list Simulations") from None


def handle_top(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        raise UserError("--json prints one view: add --once (rankpack top --once --json)")
    if not MIN_INTERVAL_S <= args.interval <= MAX_INTERVAL_S:
        raise UserError(f"--interval {args.interval:g} is out of range; give "
                        f"{MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds")  # fmt: skip
    api = simulation_api(args)
    if args.once:
        view = fetch(api)
        if args.json:
            print_json(view)
        else:
            Console().print(render(view))
        return 0
    with stop_on_signals() as stop, Live(render(fetch(api)), auto_refresh=False) as live:
        while not stop.wait(args.interval):
            live.update(render(fetch(api)), refresh=True)
    return 0
