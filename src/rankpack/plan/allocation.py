"""Per-rank CPU requests proportional to weights, in millicores, summing exactly to a budget.

Called by the CLI (`rankpack plan`, `rankpack run`) and by the controller when it resizes
ranks from measured duty cycles. Pure functions, no I/O.

Rounding: each rank first gets ``floor(budget * w_i / sum(w))`` millicores; the millicores
left over go one each to the ranks with the largest fractional remainders (ties: lower
rank first), so the sum is exactly the budget (seed 000 §3.1.2: 1,1,5,15 over 4 cores gives
182m, 182m, 909m, 2727m). A per-rank floor is met by pinning the ranks that would fall
below it at the floor and sharing the rest of the budget among the others in proportion.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from rankpack import quantities
from rankpack.quantities import MAX_RANKS, InvalidQuantity


class QoS(StrEnum):
    """How a plan is enforced: requests only (Burstable) or requests = limits (Guaranteed)."""

    REQUESTS = "requests"
    LIMITS = "limits"


@dataclass(frozen=True)
class RankAllocation:
    rank: int
    weight: float
    cpu_millis: int
    """CPU request in millicores (the scheduling weight)."""
    limit_millis: int | None = None
    """Hard CPU limit in millicores, or None for requests-only."""


@dataclass(frozen=True)
class Plan:
    total_millis: int
    ranks: tuple[RankAllocation, ...]
    qos: QoS = QoS.REQUESTS

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    def to_json(self) -> dict[str, object]:
        return {
            "total_millis": self.total_millis,
            "qos": self.qos.value,
            "ranks": [
                {
                    "rank": r.rank,
                    "weight": r.weight,
                    "cpu_millis": r.cpu_millis,
                    "limit_millis": r.limit_millis,
                }
                for r in self.ranks
            ],
        }


_GROUP = re.compile(r"^\s*(\d+)\s*[x*×]\s*([^\s]+)\s*$")


def parse_weights(text: str, name: str = "weights") -> list[float]:
    """Parse ``1,1,5,15`` or grouped ``8x1,4x5,4x15`` (also ``8*1``) into a weight list.

    At most `MAX_RANKS` weights (a group's count is checked before it is expanded); each
    weight is finite and positive.
    """
    if not text.strip():
        raise InvalidQuantity(f"{{{name}}} is empty; give a comma-separated list such as 1,1,5,15")
    quantities.list_text(text, name)
    weights: list[float] = []
    for item in text.split(","):
        item = item.strip()
        count = 1
        value_text = item
        match = _GROUP.match(item)
        if match:
            count = MAX_RANKS + 1 if len(match.group(1)) > 9 else int(match.group(1))
            value_text = match.group(2)
            if count < 1:
                raise InvalidQuantity(
                    f"{{{name}}}: group {quantities.literal(item)} has a count below 1; "
                    "use e.g. 8x1"
                )
        if len(weights) + count > MAX_RANKS:
            raise InvalidQuantity(
                f"{{{name}}} gives more than {MAX_RANKS} weights (one per rank; at most "
                f"{MAX_RANKS} ranks)"
            )
        value: float | None
        try:
            value = quantities.parse_real(value_text, name)
        except InvalidQuantity:
            value = _non_finite(value_text)
        if value is None:
            raise InvalidQuantity(
                f"{{{name}}}: weight {quantities.literal(item)} is not a number; use numbers "
                "like 1,1,5,15 or groups like 8x1"
            )
        if not math.isfinite(value) or value <= 0 or value > 1e12:
            raise InvalidQuantity(
                f"{{{name}}}: weight {quantities.literal(item)} must be a positive number "
                "(every rank needs CPU) of at most 1e12"
            )
        weights.extend([value] * count)
    return weights


def _non_finite(text: str) -> float | None:
    """nan, inf, 1e999: numbers Python reads, but not finite; None for non-numbers."""
    try:
        value = float(text) if len(text) <= 40 else None
    except ValueError:
        return None
    return None if value is None or math.isfinite(value) else value


def budget_to_millis(cores: float, name: str = "budget") -> int:
    """Cores (e.g. 4 or 2.5) to millicores; positive and at most `quantities.MAX_CORES`."""
    if not math.isfinite(cores) or cores <= 0:
        raise InvalidQuantity(f"{{{name}}} must be a positive number of cores, got {cores:g}")
    return quantities.cpu_millis(cores, name, lo=1)


def _largest_remainder(weights: list[float], total: int) -> list[int]:
    wsum = math.fsum(weights)
    exact = [total * w / wsum for w in weights]
    base = [math.floor(x) for x in exact]
    left = total - sum(base)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return base


def proportional_millis(
    weights: list[float], total_millis: int, floor_millis: int = 0
) -> list[int]:
    """Split ``total_millis`` in proportion to ``weights`` with every rank at least the floor."""
    n = len(weights)
    if n == 0:
        raise InvalidQuantity("a plan needs at least one rank ({ranks})")
    if n > MAX_RANKS:
        raise InvalidQuantity(f"{{ranks}} must be at most {MAX_RANKS}, got {n} weights")
    quantities.count(total_millis, "budget", lo=0, hi=quantities.MAX_MILLIS)
    if floor_millis < 0:
        raise InvalidQuantity(f"{{floor}} must be >= 0 millicores, got {floor_millis}")
    if floor_millis * n > total_millis:
        raise InvalidQuantity(
            f"{{budget}} {total_millis}m is too small for {n} ranks with a {{floor}} of "
            f"{floor_millis}m each (needs {floor_millis * n}m); raise the budget or lower the floor"
        )
    pinned: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in pinned]
        remaining = total_millis - floor_millis * len(pinned)
        shares = _largest_remainder([weights[i] for i in free], remaining)
        below = {i for i, s in zip(free, shares, strict=True) if s < floor_millis}
        if not below:
            result = [floor_millis] * n
            for i, s in zip(free, shares, strict=True):
                result[i] = s
            return result
        pinned |= below


def make_plan(
    weights: list[float],
    total_millis: int,
    *,
    floor_millis: int = 0,
    qos: QoS = QoS.REQUESTS,
) -> Plan:
    """A plan whose requests follow ``weights`` and sum exactly to ``total_millis``."""
    millis = proportional_millis(weights, total_millis, floor_millis)
    ranks = tuple(
        RankAllocation(
            rank=i,
            weight=w,
            cpu_millis=m,
            limit_millis=m if qos is QoS.LIMITS else None,
        )
        for i, (w, m) in enumerate(zip(weights, millis, strict=True))
    )
    return Plan(total_millis=total_millis, ranks=ranks, qos=qos)


def resolve_weights(weights_text: str | None, ranks: int | None, equal: bool) -> list[float]:
    """The weight vector from the CLI's --weights / --equal / --ranks, validated together."""
    if ranks is not None:
        quantities.ranks(ranks)
    if equal or weights_text is None:
        if ranks is None:
            raise InvalidQuantity("give {weights} W1,W2,... or {equal} {ranks} N")
        if weights_text is not None:
            raise InvalidQuantity("{equal} and {weights} exclude each other; give one of them")
        return [1.0] * ranks
    weights = parse_weights(weights_text)
    if ranks is not None and len(weights) != ranks:
        raise InvalidQuantity(
            f"{{weights}} has {len(weights)} values but {{ranks}} is {ranks}; "
            "give one weight per rank"
        )
    return weights
