"""Where the linear contention model is known to break, as one-line warnings.

Seed 001 §5.3: the linear assumption fails at high load rho (memory-bandwidth saturation,
CFS context switches, TCP congestion become superlinear), and for duty cycles well above
the 5-20 % it was validated on. Called by the fit, the predictor and the planner; the CLI
prints each warning on stderr and lists them in the JSON.
"""

from __future__ import annotations

import re

from rankpack.model.shape import RHO_VALIDATED, ClusterShape

DUTY_VALIDATED_MAX = 0.25
"""Seed 001 validated the model on mean duty cycles of 5-20 %; above this we warn."""
DUTY_NO_BENEFIT = 0.5
"""Seed 001 §6: above a mean duty cycle of 50 % multiplexing is not recommended."""


def extrapolation_warnings(
    n: int,
    shape: ClusterShape,
    *,
    beta: float | None = None,
    max_fitted_n: int | None = None,
    mean_duty: float | None = None,
) -> list[str]:
    """Warnings for predicting N simulations (empty when N is inside the validated range)."""
    out: list[str] = []
    rho = shape.rho(n)
    if rho > RHO_VALIDATED:
        out.append(
            f"N={n}: rho={rho:.2f} > 1 (more rank pods than vCPUs); the linear model is "
            "not validated there and will underestimate the makespan"
        )
    if max_fitted_n is not None and n > max_fitted_n:
        out.append(
            f"N={n} is beyond the largest N used in the fit ({max_fitted_n}); "
            "treat the prediction as an extrapolation"
        )
    if beta is not None and beta * shape.ranks >= shape.total_cpus:
        out.append(
            f"beta={beta:.3f} >= M*C/R={shape.total_cpus / shape.ranks:.3f}: the model says "
            "adding a simulation never raises throughput"
        )
    if mean_duty is not None:
        if mean_duty > DUTY_NO_BENEFIT:
            out.append(
                f"mean duty cycle {mean_duty:.0%} > 50%: little idle CPU to reclaim; "
                "seed 001 does not recommend multiplexing here"
            )
        elif mean_duty > DUTY_VALIDATED_MAX:
            out.append(
                f"mean duty cycle {mean_duty:.0%} is above the 5-20% the linear model was "
                "validated on; contention may grow faster than linearly"
            )
    return out


_N = re.compile(r"N=(\d+)")
_RHO = re.compile(r"rho=([0-9.]+)")


def collapse(warnings: list[str], keep: int = 3) -> list[str]:
    """Per-N warnings that differ only in N (and rho) become one line for the whole range,
    so predicting N = 1..1000 does not print a thousand lines."""
    groups: dict[str, list[str]] = {}
    for w in warnings:
        key = _RHO.sub("rho=#", _N.sub("N=#", w))
        groups.setdefault(key, []).append(w)
    out: list[str] = []
    for items in groups.values():
        if len(items) <= keep:
            out.extend(items)
            continue
        ns = [int(m.group(1)) for w in items if (m := _N.search(w))]
        rhos = [m.group(1) for w in items if (m := _RHO.search(w))]
        line = _N.sub(f"N={min(ns)}..{max(ns)}", items[0], count=1) if ns else items[0]
        if rhos:
            line = _RHO.sub(f"rho={rhos[0]}..{rhos[-1]}", line, count=1)
        out.append(f"{line} ({len(items)} values of N)")
    return out
