"""The linear contention model of seed 001 §3.4 and its least-squares fit.

Called by `rankpack model fit|predict|plan` and by `rankpack.model.pareto`. Pure
computation, no I/O. The cluster and its load (`ClusterShape`, rho) are in
`rankpack.model.shape`.

Model (seed 001 Eqs. 4-5), for N simulations of R ranks on M nodes of C vCPUs::

    rho_N    = N * R / (M * C)                       normalized cluster load
    T_N      = T_1 * (1 + beta * (rho_N - rho_1))    makespan of the N-simulation batch
    Theta(N) = N * T_1 / T_N = N / (1 + beta * (rho_N - rho_1))

beta is fitted by non-linear least squares on the measured *throughput* Theta(N) (the
quantity the paper fitted; see docs/model.md for why this and not the makespan).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import curve_fit

from rankpack import quantities
from rankpack.errors import UserError
from rankpack.model.shape import ClusterShape
from rankpack.model.warnings import extrapolation_warnings
from rankpack.quantities import InvalidQuantity, literal


def check_beta(beta: float) -> None:
    if not math.isfinite(beta) or beta < 0 or beta > quantities.MAX_COEFFICIENT:
        raise InvalidQuantity(
            f"{{beta}} must be a finite number >= 0 and <= {quantities.MAX_COEFFICIENT:g}, "
            f"got {beta:g}"
        )


def slowdown(n: float, beta: float, shape: ClusterShape) -> float:
    """T_N / T_1 = 1 + beta (rho_N - rho_1)."""
    check_beta(beta)
    return 1.0 + beta * shape.delta_rho(n)


def throughput(n: float, beta: float, shape: ClusterShape) -> float:
    """Theta(N) = N / (1 + beta (rho_N - rho_1)); Theta(1) = 1."""
    return n / slowdown(n, beta, shape)


def makespan_s(n: float, beta: float, shape: ClusterShape, t1_s: float) -> float:
    """T_N = T_1 (1 + beta (rho_N - rho_1))."""
    check_time(t1_s, 1)
    return t1_s * slowdown(n, beta, shape)


def check_time(makespan: float, n: float) -> None:
    if not math.isfinite(makespan) or makespan <= 0 or makespan > quantities.MAX_SECONDS:
        raise InvalidQuantity(
            f"makespan for N={n:g} must be a positive number of seconds (at most "
            f"{quantities.MAX_SECONDS:g}), got {makespan:g}"
        )


@dataclass(frozen=True)
class MeasuredPoint:
    """One measurement: the makespan of N simulations run together."""

    n: int
    makespan_s: float


def parse_point(text: str) -> MeasuredPoint:
    """'3:1446' -> MeasuredPoint(n=3, makespan_s=1446.0)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise InvalidQuantity(f"point {literal(text)} is not N:makespan_s; write e.g. 2:1410")
    try:
        n = quantities.parse_int(parts[0], "points")
        t = _seconds_or_nan(parts[1])
    except InvalidQuantity:
        raise InvalidQuantity(
            f"point {literal(text)} is not N:makespan_s with an integer N and a finite "
            "makespan; write e.g. 2:1410"
        ) from None
    if n <= 0 or n > quantities.MAX_SIMULATIONS:
        raise InvalidQuantity(
            f"point {literal(text)}: N must be >= 1 and <= {quantities.MAX_SIMULATIONS} "
            "(number of concurrent simulations)"
        )
    check_time(t, n)
    return MeasuredPoint(n=n, makespan_s=t)


def _seconds_or_nan(text: str) -> float:
    """A makespan as written: a decimal number, or nan/inf (refused by `check_time`)."""
    try:
        return quantities.parse_real(text, "points")
    except InvalidQuantity:
        if text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            return math.nan
        raise


@dataclass(frozen=True)
class PointFit:
    n: int
    rho: float
    makespan_s: float
    throughput: float
    """Measured Theta(N) = N T_1 / T_N."""
    predicted_throughput: float
    predicted_makespan_s: float
    error_pct: float
    """(predicted - measured) / measured makespan, in %; > 0 means the model is conservative."""
    throughput_error_pct: float
    """(predicted - measured) / measured throughput, in %."""
    used_in_fit: bool


@dataclass(frozen=True)
class FitResult:
    beta: float
    beta_stderr: float | None
    """Standard error of beta; None when the fit has no residual degrees of freedom."""
    t1_s: float
    shape: ClusterShape
    calibrated_on: tuple[int, ...]
    points: tuple[PointFit, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def max_abs_error_pct(self) -> float:
        return max(abs(p.error_pct) for p in self.points)

    @property
    def max_fitted_n(self) -> int:
        return max(self.calibrated_on)

    def to_json(self) -> dict[str, object]:
        return {
            "beta": self.beta,
            "beta_stderr": self.beta_stderr,
            "t1_s": self.t1_s,
            "ranks": self.shape.ranks,
            "nodes": self.shape.nodes,
            "cpus_per_node": self.shape.cpus_per_node,
            "calibrated_on": list(self.calibrated_on),
            "max_abs_error_pct": self.max_abs_error_pct,
            "points": [
                {
                    "n": p.n,
                    "rho": p.rho,
                    "makespan_s": p.makespan_s,
                    "throughput": p.throughput,
                    "predicted_throughput": p.predicted_throughput,
                    "predicted_makespan_s": p.predicted_makespan_s,
                    "error_pct": p.error_pct,
                    "throughput_error_pct": p.throughput_error_pct,
                    "used_in_fit": p.used_in_fit,
                }
                for p in self.points
            ],
            "warnings": list(self.warnings),
        }


def _validated_points(points: Sequence[MeasuredPoint]) -> list[MeasuredPoint]:
    by_n: dict[int, MeasuredPoint] = {}
    for p in points:
        if p.n <= 0:
            raise UserError(f"N must be >= 1 in every point, got {p.n}")
        check_time(p.makespan_s, p.n)
        if p.n in by_n:
            raise UserError(
                f"two points for N={p.n}; give one makespan per N (average repeats first)"
            )
        by_n[p.n] = p
    if 1 not in by_n:
        raise UserError(
            "the points need the single-simulation baseline 1:T1_s (T_1 anchors the model)"
        )
    if len(by_n) < 2:
        raise UserError("a fit needs at least two points: the baseline 1:T1_s and one N >= 2")
    return [by_n[n] for n in sorted(by_n)]


def fit_beta(
    points: Sequence[MeasuredPoint],
    shape: ClusterShape,
    *,
    calibrate_on: Sequence[int] | None = None,
) -> FitResult:
    """Fit beta to measured makespans; predict every point.

    T_1 is the measured single-simulation makespan (held fixed, as in seed 001). beta
    minimizes sum_N (Theta_meas(N) - N / (1 + beta (rho_N - rho_1)))^2 over the points
    used for the fit (all points, or N = 1 plus the N in ``calibrate_on``). The standard
    error is scipy's: sqrt of the covariance scaled by the residual variance with
    n_points - 1 degrees of freedom (the N = 1 point counts, as in the paper).
    """
    pts = _validated_points(points)
    t1 = next(p.makespan_s for p in pts if p.n == 1)
    used = _calibration_set([p.n for p in pts], calibrate_on)
    beta, stderr = _least_squares_beta([p for p in pts if p.n in used], t1, shape)
    return FitResult(
        beta=beta,
        beta_stderr=stderr,
        t1_s=t1,
        shape=shape,
        calibrated_on=tuple(sorted(used)),
        points=tuple(_point_fit(p, t1, beta, shape, used_in_fit=p.n in used) for p in pts),
        warnings=tuple(dict.fromkeys(_fit_warnings(pts, used, beta, shape))),
    )


def _calibration_set(all_n: list[int], calibrate_on: Sequence[int] | None) -> set[int]:
    """The N whose points the fit uses: all of them, or N = 1 plus ``calibrate_on``."""
    if calibrate_on is None:
        return set(all_n)
    missing = [n for n in calibrate_on if n not in all_n]
    if missing:
        raise InvalidQuantity(
            f"{{calibrate_on}} {missing[0]}: no point with that N; "
            f"give it as {missing[0]}:makespan_s"
        )
    used = {1, *calibrate_on}
    if used == {1}:
        raise InvalidQuantity("{calibrate_on} needs at least one N >= 2 (N = 1 only anchors T_1)")
    return used


def _least_squares_beta(
    fit_pts: list[MeasuredPoint], t1: float, shape: ClusterShape
) -> tuple[float, float | None]:
    """beta and its standard error (None when it carries no information) fitted on the
    measured throughput of ``fit_pts``."""
    x = np.array([shape.delta_rho(p.n) for p in fit_pts])
    n_arr = np.array([float(p.n) for p in fit_pts])
    theta = n_arr * t1 / np.array([p.makespan_s for p in fit_pts])

    def model(xv: np.ndarray, beta: float) -> np.ndarray:
        # N is recovered from x; pass it through a closure to keep curve_fit's 1-D x.
        result: np.ndarray = n_arr / (1.0 + beta * xv)
        return result

    dof = len(fit_pts) - 1
    if dof < 1:  # pragma: no cover - _validated_points guarantees two points
        raise UserError("a fit needs at least two points")
    popt, pcov = curve_fit(
        model, x, theta, p0=[0.5], bounds=(0.0, np.inf), xtol=1e-14, ftol=1e-14, gtol=1e-14
    )
    beta = float(popt[0])
    if beta < 1e-9:  # the lower bound: no contention in the data
        beta = 0.0
    n_nontrivial = sum(1 for p in fit_pts if p.n != 1)
    # With a single non-baseline point the fit is exact: the stderr carries no information.
    stderr: float | None = float(math.sqrt(pcov[0][0])) if n_nontrivial >= 2 else None
    if stderr is not None and not math.isfinite(stderr):
        stderr = None
    return beta, stderr


def _point_fit(
    p: MeasuredPoint, t1: float, beta: float, shape: ClusterShape, *, used_in_fit: bool
) -> PointFit:
    """One measured point beside the fitted model's prediction for it."""
    pred_t = t1 * slowdown(p.n, beta, shape)
    meas_theta = p.n * t1 / p.makespan_s
    pred_theta = p.n * t1 / pred_t
    return PointFit(
        n=p.n,
        rho=shape.rho(p.n),
        makespan_s=p.makespan_s,
        throughput=meas_theta,
        predicted_throughput=pred_theta,
        predicted_makespan_s=pred_t,
        error_pct=round((pred_t - p.makespan_s) / p.makespan_s * 100.0, 9) + 0.0,
        throughput_error_pct=round((pred_theta - meas_theta) / meas_theta * 100.0, 9) + 0.0,
        used_in_fit=used_in_fit,
    )


def _fit_warnings(
    pts: list[MeasuredPoint], used: set[int], beta: float, shape: ClusterShape
) -> list[str]:
    """Where the fit is extrapolated or says nothing (duplicates are removed by the caller)."""
    max_fit_n = max(used)
    warns: list[str] = []
    for p in pts:
        warns.extend(extrapolation_warnings(p.n, shape, beta=beta))
    blind = [p.n for p in pts if p.n > max_fit_n]
    if blind:
        warns.append(
            f"N={','.join(map(str, blind))} beyond the largest N used in the fit ({max_fit_n}): "
            "blind extrapolation"
        )
    if beta == 0.0:
        warns.append("beta fitted to 0: the data show no contention; check the makespans")
    return warns


def points_from_sessions(sessions: Sequence[Mapping[str, Any]]) -> list[MeasuredPoint]:
    """Measured points from recorded `rankpack multiplex` sessions: one per N (the median
    makespan when several sessions ran N simulations), plus N = 1 from their single-run
    baselines (median of sequential time / N) when no session ran a single simulation.

    Only completed sessions whose simulations all completed count. N is the number of
    simulations a session ran; its makespan runs from the first launch to the last
    finish, so staggered launches are included.
    """
    by_n: dict[int, list[float]] = {}
    t1: list[float] = []
    for m in sessions:
        summary = m.get("summary") or {}
        sims = summary.get("simulations") or []
        if m.get("status") != "completed" or not sims:
            continue
        if any(s.get("status") != "completed" for s in sims):
            continue
        n = len(sims)
        by_n.setdefault(n, []).append(float(summary["makespan_s"]))
        if summary.get("sequential_s"):
            t1.append(float(summary["sequential_s"]) / n)
    if 1 not in by_n and t1:
        by_n[1] = [statistics.median(t1)]
    return [MeasuredPoint(n, statistics.median(v)) for n, v in sorted(by_n.items())]
