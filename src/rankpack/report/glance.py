"""What a glance at a running simulation shows (pure): its ETA, how busy its ranks are,
how much of the CPU it asked for does solver work, the nodes it spans and its latest
residuals. Shared by the Simulation's status (`rankpack.operator.status`) and the live
views, so that each says the same.

- **duty**: each rank's share of wall time spent computing, outside MPI (the shim's
  record); its mean and minimum over the ranks that have one.
- **efficiency**: CPU doing solver work over CPU requested: the sum of the ranks' duty
  (a computing rank uses one core) over the sum of their requests in cores. Above 1: the
  ranks computed on CPU beyond their requests (requests are not limits).
- **ETA**: from the iteration rate over recent progress marks (wall time, `eta_s`).
- **residuals**: the solver log's latest initial residual of each field; the log is written
  by the user's solver, so names and values are checked and at most `MAX_RESIDUALS` kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankpack.controller.views import SimView

MAX_RESIDUALS = 16
_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_.:()-]{0,63}$")


@dataclass(frozen=True)
class Glance:
    duty_mean: float | None = None
    duty_min: float | None = None
    efficiency: float | None = None
    nodes: tuple[str, ...] = ()
    residuals: Mapping[str, float] = field(default_factory=dict)


def residuals_of(found: Mapping[str, object]) -> dict[str, float]:
    """The residuals a status may carry: named like a field, a finite number, at most
    `MAX_RESIDUALS` (sorted by name). Anything else (a string, a bool, NaN, an integer
    beyond a float) is left out: also what a Simulation's status says is checked so when
    it is read back (`rankpack.report.top`)."""
    kept = {}
    for k, v in found.items():
        if isinstance(k, str) and _FIELD.match(k) and (number := finite(v)) is not None:
            kept[k] = number
    return {k: kept[k] for k in sorted(kept)[:MAX_RESIDUALS]}


def finite(value: object) -> float | None:
    """``value`` as a float if it is a finite number (not a bool), else None."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return number if math.isfinite(number) else None


def glance(view: SimView) -> Glance:
    duties = [r.duty for r in view.ranks if r.duty is not None]
    requested = sum(r.request_millis for r in view.ranks if r.duty is not None) / 1000
    return Glance(
        duty_mean=sum(duties) / len(duties) if duties else None,
        duty_min=min(duties) if duties else None,
        efficiency=sum(duties) / requested if duties and requested > 0 else None,
        nodes=tuple(sorted({r.node for r in view.ranks if r.node})),
        residuals=residuals_of(view.log.residuals),
    )


def eta_s(marks: Sequence[tuple[float, int]], expected: int) -> float | None:
    """Seconds from the last mark (wall time, iterations done) until ``expected``
    iterations, at the rate between the first and last marks; None without a rate (fewer
    than two marks, no progress between them), 0 once done."""
    if not marks:
        return None
    (t0, i0), (t1, i1) = marks[0], marks[-1]
    if i1 >= expected:
        return 0.0
    if i1 <= i0 or t1 <= t0:
        return None
    return (expected - i1) * (t1 - t0) / (i1 - i0)
