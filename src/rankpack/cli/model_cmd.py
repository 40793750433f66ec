"""`rankpack model fit|predict|plan`: throughput model and capacity planner (seed 001 §3.4, §5.3).

Parses options, calls `rankpack.model`, prints a table or JSON, writes PNGs on request.
Warnings (extrapolation) go to stderr, one line each, and into the JSON ``warnings`` list.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankpack.cli import OneLineArgumentParser
from rankpack.cli.common import (
    db_path,
    parse_coefficient,
    parse_cores,
    parse_cpus_per_node,
    parse_fraction,
    parse_list,
    parse_nodes,
    parse_output_dir,
    parse_positive_coefficient,
    parse_positive_millis,
    parse_price,
    parse_ranks,
    parse_seconds,
    parse_simulations,
    print_json,
)
from rankpack.errors import UserError
from rankpack.model.contention import (
    FitResult,
    MeasuredPoint,
    check_beta,
    check_time,
    fit_beta,
    parse_point,
    points_from_sessions,
    slowdown,
)
from rankpack.model.limit import limit_from_duty_cycles
from rankpack.model.overlap import (
    DutyCyclePrediction,
    check_predictor_size,
    implied_beta,
    p_overlap,
    parse_duty_cycles,
    predict_from_duty_cycles,
)
from rankpack.model.pareto import CapacityPlan, PlanInputs, plan_capacity, request_budget
from rankpack.model.shape import ClusterShape
from rankpack.model.warnings import collapse, extrapolation_warnings
from rankpack.plan.allocation import parse_weights
from rankpack.quantities import MAX_SIMULATIONS

NO_DB_RUNS = "no recorded multiplex runs in DB; give points as N:makespan_s"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "model",
        help="throughput model: fit beta, predict N simulations, plan capacity",
        description=(
            "Linear contention model of co-located MPI simulations (seed 001 §3.4): "
            "T_N = T_1 (1 + beta (rho_N - rho_1)), rho_N = N R / (M C)."
        ),
    )
    msub = p.add_subparsers(
        dest="model_command", metavar="ACTION", parser_class=OneLineArgumentParser
    )
    msub.required = True
    _register_fit(msub)
    _register_predict(msub)
    _register_plan(msub)


def _register_fit(msub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fit = msub.add_parser("fit", help="fit beta to measured makespans N:makespan_s")
    _add_shape(fit)
    fit.add_argument("points", nargs="*", metavar="N:MAKESPAN_S", help="e.g. 1:1249 2:1410 3:1446")
    fit.add_argument(
        "--from-db", action="store_true", help="take points from recorded multiplex runs"
    )
    fit.add_argument(
        "--calibrate-on",
        type=parse_simulations,
        action="append",
        metavar="N",
        help="fit on N = 1 and this N only (repeatable); predict the rest blind",
    )
    _add_duty(fit)
    fit.add_argument(
        "--plot-dir", type=parse_output_dir, metavar="DIR", help="write throughput.png here"
    )
    fit.add_argument("--json", action="store_true", help="machine-readable output")
    fit.set_defaults(handler=handle_fit)


def _register_predict(msub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    pred = msub.add_parser("predict", help="throughput and makespan for N = 1..max-n")
    _add_shape(pred)
    pred.add_argument(
        "--beta", type=parse_coefficient, help="contention coefficient (from `model fit`)"
    )
    pred.add_argument(
        "--t1", type=parse_seconds, metavar="SECONDS", help="single-simulation makespan"
    )
    pred.add_argument(
        "--max-n",
        type=parse_simulations,
        help=f"largest N to predict (default: largest N with rho <= 1, at most {MAX_SIMULATIONS})",
    )
    pred.add_argument(
        "--fitted-max-n",
        type=parse_simulations,
        metavar="N",
        help="largest N beta was fitted on (warns beyond)",
    )
    pred.add_argument(
        "--duty",
        type=parse_fraction,
        metavar="D",
        help="mean duty cycle for P(>=2) if no --duty-cycles",
    )
    _add_duty(pred)
    pred.add_argument("--json", action="store_true", help="machine-readable output")
    pred.set_defaults(handler=handle_predict)


def _register_plan(msub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = msub.add_parser("plan", help="how many simulations fit a cluster/quota; recommended N")
    _add_shape(plan)
    plan.add_argument(
        "points", nargs="*", metavar="N:MAKESPAN_S", help="measured points to fit beta from"
    )
    plan.add_argument(
        "--beta", type=parse_coefficient, help="contention coefficient instead of points"
    )
    plan.add_argument(
        "--t1", type=parse_seconds, metavar="SECONDS", help="single-simulation makespan"
    )
    _add_duty(plan)
    plan.add_argument(
        "--weights",
        type=parse_list,
        help="per-rank weights for proportional requests, e.g. 8x1,4x5,4x15",
    )
    plan.add_argument(
        "--rank-millis",
        type=parse_positive_millis,
        default=1000,
        metavar="MILLIS",
        help="equal per-rank request; the heaviest rank keeps it when proportional (1000m)",
    )
    plan.add_argument(
        "--quota", type=parse_cores, metavar="CORES", help="ResourceQuota requests.cpu in cores"
    )
    plan.add_argument(
        "--allocation",
        choices=["proportional", "equal"],
        default="proportional",
        help="which requests the recommendation must fit (default proportional)",
    )
    plan.add_argument(
        "--price-per-node-hour", type=parse_price, metavar="USD", help="e.g. 0.343 (c5.2xlarge)"
    )
    plan.add_argument(
        "--max-n",
        type=parse_simulations,
        help=f"largest N to consider (default: largest N with rho <= 1, at most {MAX_SIMULATIONS})",
    )
    plan.add_argument(
        "--plot-dir", type=parse_output_dir, metavar="DIR", help="write efficiency.png here"
    )
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.set_defaults(handler=handle_plan)


def _add_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=parse_ranks, required=True, help="R: MPI ranks per simulation")
    p.add_argument(
        "--nodes", type=parse_nodes, required=True, help="M: nodes shared by the simulations"
    )
    p.add_argument(
        "--cpus", type=parse_cpus_per_node, required=True, help="C: allocatable vCPUs per node"
    )


def _add_duty(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--duty-cycles",
        type=parse_list,
        metavar="LIST",
        help="measured per-rank duty cycles, e.g. 8x0.05,4x0.115,4x0.194 (duty-cycle predictor)",
    )
    p.add_argument(
        "--mem-streams",
        type=parse_positive_coefficient,
        default=1.0,
        metavar="B",
        help="ranks a node's memory bandwidth feeds at full speed (default 1: bandwidth-bound)",
    )


def _shape(args: argparse.Namespace) -> ClusterShape:
    return ClusterShape(ranks=args.ranks, nodes=args.nodes, cpus_per_node=args.cpus)


def _warn(warnings: Sequence[str]) -> None:
    for w in warnings:
        print(f"rankpack: warning: {w}", file=sys.stderr)


def load_multiplex_points(db: Path) -> list[MeasuredPoint]:
    """Points from the `rankpack multiplex` sessions recorded in ``db`` (never creates it)."""
    from rankpack.store import Store

    if not db.exists():
        raise UserError(f"{NO_DB_RUNS} (database {db} does not exist)")
    sessions = Store(db, create=False).multiplex_sessions()
    points = points_from_sessions([{"status": m.status, "summary": m.summary} for m in sessions])
    if not points:
        raise UserError(NO_DB_RUNS)
    return points


def _points(args: argparse.Namespace) -> list[MeasuredPoint]:
    if getattr(args, "from_db", False):
        if args.points:
            raise UserError("give points either on the command line or with --from-db, not both")
        return load_multiplex_points(db_path(args))
    return [parse_point(t) for t in args.points]


def _duty_predictions(
    args: argparse.Namespace, shape: ClusterShape, n_max: int
) -> list[DutyCyclePrediction] | None:
    if not args.duty_cycles:
        return None
    duty = parse_duty_cycles(args.duty_cycles)
    check_predictor_size(n_max, duty, shape)
    return [
        predict_from_duty_cycles(n, duty, shape, mem_streams=args.mem_streams)
        for n in range(1, n_max + 1)
    ]


def _limit(args: argparse.Namespace, shape: ClusterShape, n: int) -> float | None:
    """The work-conserving bound on the gain of N (`rankpack.model.limit`), or None."""
    if not args.duty_cycles:
        return None
    return limit_from_duty_cycles(n, parse_duty_cycles(args.duty_cycles), shape)


def _mean_duty(args: argparse.Namespace) -> float | None:
    if getattr(args, "duty_cycles", None):
        d = parse_duty_cycles(args.duty_cycles)
        return sum(d) / len(d)
    duty: float | None = getattr(args, "duty", None)
    return duty


# ---------------------------------------------------------------- fit


def handle_fit(args: argparse.Namespace) -> int:
    shape = _shape(args)
    points = _points(args)
    if len(points) < 2:
        raise UserError("a fit needs at least two points N:makespan_s, e.g. 1:1249 2:1410")
    result = fit_beta(points, shape, calibrate_on=args.calibrate_on)
    n_max = max(p.n for p in result.points)
    duty_preds = _duty_predictions(args, shape, n_max + 1)
    warnings = list(result.warnings)
    mean_duty = _mean_duty(args)
    if mean_duty is not None:
        warnings += extrapolation_warnings(1, shape, mean_duty=mean_duty)
    out = result.to_json()
    out["warnings"] = warnings
    if duty_preds is not None:
        out["duty_cycle_model"] = _duty_json(
            duty_preds, result, shape, {p.n: _limit(args, shape, p.n) for p in duty_preds}
        )
    if args.plot_dir is not None:
        out["plots"] = [str(_fit_plot(args.plot_dir, result, duty_preds))]
    _warn(warnings)
    if args.json:
        print_json(out)
        return 0
    _print_fit(result, duty_preds, out)
    return 0


def _duty_json(
    preds: list[DutyCyclePrediction],
    fit: FitResult,
    shape: ClusterShape,
    limits: dict[int, float | None],
) -> dict[str, object]:
    measured = {p.n: p for p in fit.points}
    rows: list[dict[str, object]] = []
    for p in preds:
        row: dict[str, object] = {
            "n": p.n,
            "predicted_throughput": p.throughput,
            "throughput_limit": limits.get(p.n),
            "p_overlap": p.p_overlap,
        }
        if p.n in measured:
            m = measured[p.n]
            pred_t = fit.t1_s * p.slowdown
            row["predicted_makespan_s"] = pred_t
            row["error_pct"] = (pred_t - m.makespan_s) / m.makespan_s * 100.0
        rows.append(row)
    in_range = [p for p in preds if p.n in measured]
    errs = [abs(float(r["error_pct"])) for r in rows if "error_pct" in r]  # type: ignore[arg-type]
    return {
        "implied_beta": implied_beta(in_range, shape) if any(p.n > 1 for p in in_range) else None,
        "max_abs_error_pct": max(errs) if errs else None,
        "points": rows,
    }


def _fit_plot(plot_dir: Path, result: FitResult, duty: list[DutyCyclePrediction] | None) -> Path:
    from rankpack.model.plots import ThetaCurve, plot_throughput

    shape = result.shape
    n_hi = max(max(p.n for p in result.points) + 1, min(shape.max_n_within_rho(), MAX_SIMULATIONS))
    grid = [1 + i * (n_hi - 1) / 100 for i in range(101)]
    on = ",".join(map(str, result.calibrated_on))
    label = f"model β={result.beta:.3f} (N={on})"
    curves = [ThetaCurve(label, grid, [n / slowdown(n, result.beta, shape) for n in grid])]
    if duty is not None:
        curves.append(
            ThetaCurve("duty-cycle predictor", [p.n for p in duty], [p.throughput for p in duty])
        )
    return plot_throughput(
        plot_dir / "throughput.png",
        measured_n=[p.n for p in result.points],
        measured_throughput=[p.throughput for p in result.points],
        curves=curves,
        fitted_max_n=result.max_fitted_n,
        errors_pct=[p.error_pct for p in result.points],
    )


def _print_fit(
    result: FitResult, duty: list[DutyCyclePrediction] | None, out: dict[str, object]
) -> None:
    se = (
        f" ± {result.beta_stderr:.3f}"
        if result.beta_stderr is not None
        else " (exact: one point, no stderr)"
    )
    title = f"β = {result.beta:.3f}{se}, fitted on N = {', '.join(map(str, result.calibrated_on))}"
    table = Table(title=title)
    for col in ("N", "rho", "makespan s", "Θ measured", "Θ model", "makespan err %", "in fit"):
        table.add_column(col, justify="right")
    for p in result.points:
        table.add_row(
            str(p.n),
            f"{p.rho:.3f}",
            f"{p.makespan_s:g}",
            f"{p.throughput:.3f}",
            f"{p.predicted_throughput:.3f}",
            f"{p.error_pct:+.1f}",
            "yes" if p.used_in_fit else "blind",
        )
    console = Console()
    console.print(table)
    if duty is not None:
        d = out["duty_cycle_model"]
        assert isinstance(d, dict)
        console.print(
            f"duty-cycle predictor (no calibration): implied β = {d['implied_beta']:.3f}, "
            f"max |makespan error| = {d['max_abs_error_pct']:.1f}%"
        )
        limits = ", ".join(
            f"N={row['n']}: {row['throughput_limit']:.2f}x"
            for row in d["points"]
            if isinstance(row.get("throughput_limit"), float)
        )
        console.print(f"physical limit of the gain (work-conserving): {limits}")
    for path in out.get("plots", []):  # type: ignore[attr-defined]
        console.print(f"wrote {path}")


# ---------------------------------------------------------------- predict


def handle_predict(args: argparse.Namespace) -> int:
    shape = _shape(args)
    if args.beta is None and not args.duty_cycles:
        raise UserError("give --beta B (from `rankpack model fit`) or --duty-cycles LIST")
    if args.beta is not None:
        check_beta(args.beta)
    if args.t1 is not None:
        check_time(args.t1, 1)
    n_max = args.max_n if args.max_n is not None else min(shape.max_n_within_rho(), MAX_SIMULATIONS)
    if n_max < 1:
        raise UserError(f"--max-n must be >= 1, got {n_max}")
    duty_preds = _duty_predictions(args, shape, n_max)
    mean_duty = _mean_duty(args)
    if args.duty is not None and not 0 <= args.duty <= 1:
        raise UserError(f"--duty must be a fraction between 0 and 1, got {args.duty:g}")
    rows: list[dict[str, object]] = []
    warnings: list[str] = []
    if mean_duty is not None:
        warnings += extrapolation_warnings(1, shape, mean_duty=mean_duty)
    for n in range(1, n_max + 1):
        row: dict[str, object] = {
            "n": n,
            "rho": shape.rho(n),
            "pods_per_node": shape.pods_per_node(n),
        }
        if args.beta is not None:
            slow = slowdown(n, args.beta, shape)
            row["throughput"] = n / slow
            row["efficiency"] = 1 / slow
            row["slowdown"] = slow
            if args.t1 is not None:
                row["makespan_s"] = args.t1 * slow
        if duty_preds is not None:
            dp = duty_preds[n - 1]
            row["duty_model_throughput"] = dp.throughput
            row["duty_model_slowdown"] = dp.slowdown
            row["throughput_limit"] = _limit(args, shape, n)
            if args.t1 is not None:
                row["duty_model_makespan_s"] = args.t1 * dp.slowdown
        if mean_duty is not None:
            row["p_overlap"] = p_overlap(shape.pods_per_node(n), mean_duty)
        warnings += extrapolation_warnings(n, shape, beta=args.beta, max_fitted_n=args.fitted_max_n)
        rows.append(row)
    warnings = collapse(list(dict.fromkeys(warnings)))
    _warn(warnings)
    if args.json:
        print_json({"beta": args.beta, "t1_s": args.t1, "rows": rows, "warnings": warnings})
        return 0
    table = Table(
        title="predicted throughput" + (f" (β = {args.beta:g})" if args.beta is not None else "")
    )
    cols = [k for k in rows[0] if k != "pods_per_node"]
    for c in cols:
        table.add_column("limit" if c == "throughput_limit" else c, justify="right")
    for row in rows:
        table.add_row(*(_fmt(row.get(c)) for c in cols))
    Console().print(table)
    return 0


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return "-" if v is None else str(v)


# ---------------------------------------------------------------- plan


def handle_plan(args: argparse.Namespace) -> int:
    shape = _shape(args)
    n_max = args.max_n if args.max_n is not None else min(shape.max_n_within_rho(), MAX_SIMULATIONS)
    if n_max < 1:
        raise UserError(f"--max-n must be >= 1, got {n_max}")
    warnings: list[str] = []
    t1 = args.t1
    fitted_max_n: int | None = None
    source: str
    if args.points:
        if args.beta is not None:
            raise UserError("give measured points or --beta, not both")
        fit = fit_beta([parse_point(t) for t in args.points], shape)
        beta: float | None = fit.beta
        t1 = t1 if t1 is not None else fit.t1_s
        fitted_max_n = fit.max_fitted_n
        source = f"fit on N = {','.join(map(str, fit.calibrated_on))}"
    elif args.beta is not None:
        check_beta(args.beta)
        beta = args.beta
        source = "given β"
    elif args.duty_cycles:
        beta = None
        source = "duty-cycle predictor"
    else:
        raise UserError("give measured points N:makespan_s, --beta B, or --duty-cycles LIST")
    if t1 is not None:
        check_time(t1, 1)
    if beta is not None:
        slowdowns = [slowdown(n, beta, shape) for n in range(1, n_max + 1)]
    else:
        preds = _duty_predictions(args, shape, n_max)
        assert preds is not None
        slowdowns = [p.slowdown for p in preds]
    weights = parse_weights(args.weights) if args.weights else None
    budget = request_budget(weights, shape.ranks, args.rank_millis)
    quota = round(args.quota * 1000) if args.quota is not None else None
    plan = plan_capacity(
        slowdowns,
        PlanInputs(
            shape=shape,
            budget=budget,
            n_max=n_max,
            t1_s=t1,
            price_per_node_hour=args.price_per_node_hour,
            quota_millis=quota,
            proportional=args.allocation == "proportional",
        ),
    )
    mean_duty = _mean_duty(args)
    if mean_duty is not None:
        warnings += extrapolation_warnings(1, shape, mean_duty=mean_duty)
    for n in range(1, n_max + 1):
        warnings += extrapolation_warnings(n, shape, beta=beta, max_fitted_n=fitted_max_n)
    warnings += plan.warnings
    warnings = collapse(list(dict.fromkeys(warnings)))
    out = plan.to_json()
    out["beta"] = beta
    out["source"] = source
    out["t1_s"] = t1
    out["warnings"] = warnings
    if args.plot_dir is not None:
        from rankpack.model.plots import plot_efficiency

        path = plot_efficiency(
            args.plot_dir / "efficiency.png",
            n=[r.n for r in plan.rows],
            efficiency=[r.efficiency for r in plan.rows],
            degradation_pct=[r.degradation_pct for r in plan.rows],
            knee_n=plan.knee_n or None,
        )
        out["plots"] = [str(path)]
    _warn(warnings)
    if args.json:
        print_json(out)
        return 0
    _print_plan(plan, out, source)
    return 0


def _print_plan(plan: CapacityPlan, out: dict[str, object], source: str) -> None:
    table = Table(title=f"capacity plan ({source})")
    for col in ("N", "rho", "Θ", "eff %", "degr %", "makespan s", "$/sim", "equal req", "prop req"):
        table.add_column(col, justify="right")
    for r in plan.rows:
        table.add_row(
            str(r.n),
            f"{r.rho:.2f}",
            f"{r.throughput:.2f}",
            f"{r.efficiency * 100:.0f}",
            f"{r.degradation_pct:.0f}",
            f"{r.makespan_s:.0f}" if r.makespan_s is not None else "-",
            f"{r.cost_per_sim:.2f}" if r.cost_per_sim is not None else "-",
            f"{r.equal_request_millis / 1000:g}" + ("" if r.fits_quota_equal else " ✗"),
            f"{r.proportional_request_millis / 1000:g}"
            + ("" if r.fits_quota_proportional else " ✗"),
        )
    console = Console()
    console.print(table)
    limit = "quota" if plan.quota_millis is not None else "cluster"
    console.print(
        f"fit the {limit}: up to N = {plan.max_n_equal} with equal requests, "
        f"N = {plan.max_n_proportional} with proportional requests "
        "(requests in vCPU; ✗ = does not fit)"
    )
    console.print(f"knee N = {plan.knee_n}; recommended N = {plan.recommended_n}")
    for path in out.get("plots", []):  # type: ignore[attr-defined]
        console.print(f"wrote {path}")
