"""`rankpack plan`: print per-rank CPU requests for a weight vector and a budget."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from rankpack.cli.common import parse_cores, parse_list, parse_millis, parse_ranks, print_json
from rankpack.plan.allocation import QoS, budget_to_millis, make_plan, resolve_weights


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="per-rank CPU requests (millicores) proportional to weights",
        description=(
            "Split a CPU budget over MPI ranks in proportion to their weights. "
            "The requests sum exactly to the budget."
        ),
    )
    p.add_argument(
        "--weights", type=parse_list, help="per-rank weights: 1,1,5,15 or grouped 8x1,4x5,4x15"
    )
    p.add_argument("--equal", action="store_true", help="equal weights (needs --ranks)")
    p.add_argument("--ranks", type=parse_ranks, help="number of MPI ranks")
    p.add_argument(
        "--budget",
        type=parse_cores,
        help="total CPU in cores (default: one core per rank)",
    )
    p.add_argument(
        "--floor",
        type=parse_millis,
        default=0,
        metavar="MILLIS",
        help="minimum request per rank, e.g. 50m (default 0)",
    )
    p.add_argument(
        "--qos",
        choices=[q.value for q in QoS],
        default=QoS.REQUESTS.value,
        help="requests (default) or limits (requests = limits; see `rankpack run --help`)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    weights = resolve_weights(args.weights, args.ranks, args.equal)
    budget = budget_to_millis(args.budget if args.budget is not None else float(len(weights)))
    plan = make_plan(weights, budget, floor_millis=args.floor, qos=QoS(args.qos))
    if args.json:
        print_json(plan.to_json())
        return 0
    table = Table(title=f"CPU plan: {plan.total_millis}m over {plan.n_ranks} ranks ({plan.qos})")
    table.add_column("rank", justify="right")
    table.add_column("weight", justify="right")
    table.add_column("request", justify="right")
    table.add_column("limit", justify="right")
    for r in plan.ranks:
        limit = f"{r.limit_millis}m" if r.limit_millis is not None else "-"
        table.add_row(str(r.rank), f"{r.weight:g}", f"{r.cpu_millis}m", limit)
    table.add_row("sum", "", f"{sum(r.cpu_millis for r in plan.ranks)}m", "", style="bold")
    Console().print(table)
    return 0
