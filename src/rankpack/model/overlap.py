"""Compute-phase overlap on a node, and a contention predictor built from duty cycles.

Seed 001 §6: on a node hosting K pods each computing a fraction d of the time
(independently), the probability that two or more compute at once is::

    P(>=2) = 1 - (1 - d)^K - K d (1 - d)^(K - 1)

K may be fractional (an average over nodes, e.g. K = N R / M = 6.7 at N = 5).

Beyond the paper, `predict_from_duty_cycles` turns measured per-rank duty cycles into a
makespan prediction with no N = 2 calibration run (see docs/model.md, "Duty-cycle
predictor"): each rank's compute phase is stretched by the pods that compute at the same
time on its node, and a bulk-synchronous iteration waits for the slowest rank. Called by
the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rankpack import quantities
from rankpack.errors import UserError
from rankpack.model.shape import ClusterShape, check_n
from rankpack.quantities import InvalidQuantity, literal


def check_duty(d: float) -> None:
    if not math.isfinite(d) or d < 0 or d > 1:
        raise InvalidQuantity(f"a duty cycle must be a fraction between 0 and 1, got {d:g}")


def p_overlap(pods: float, duty: float) -> float:
    """P(>=2 of K pods compute at once) = 1 - (1-d)^K - K d (1-d)^(K-1)."""
    check_duty(duty)
    if not math.isfinite(pods) or pods < 0:
        raise UserError(f"the number of pods on a node must be >= 0, got {pods:g}")
    if pods < 1 or duty == 0:
        return 0.0
    q = 1.0 - duty
    p: float = 1.0 - q**pods - pods * duty * q ** (pods - 1)
    return min(1.0, max(0.0, p))


def parse_duty_cycles(text: str) -> list[float]:
    """'0.05,0.2' or grouped '8x0.05,4x0.115,4x0.194'; values may also be percents ('5%')."""
    out: list[float] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise InvalidQuantity(
                "{duty_cycles} has an empty item; write e.g. 8x0.05,4x0.115,4x0.194"
            )
        count = 1
        value_text = item
        for sep in ("x", "*", "×"):
            if sep in item:
                left, value_text = item.split(sep, 1)
                try:
                    count = quantities.parse_int(left, "duty_cycles")
                except InvalidQuantity:
                    raise InvalidQuantity(
                        f"duty-cycle group {literal(item)} needs an integer count, e.g. 8x0.05"
                    ) from None
                break
        pct = value_text.endswith("%")
        try:
            value = quantities.parse_real(value_text.rstrip("%"), "duty_cycles")
        except InvalidQuantity:
            raise InvalidQuantity(
                f"duty cycle {literal(item)} is not a number between 0 and 1; write e.g. 0.05 or 5%"
            ) from None
        if pct:
            value /= 100.0
        if count < 1:
            raise InvalidQuantity(f"duty-cycle group {literal(item)} has a count below 1")
        if len(out) + count > quantities.MAX_RANKS:
            raise InvalidQuantity(
                f"{{duty_cycles}} gives more than {quantities.MAX_RANKS} values (one per rank)"
            )
        check_duty(value)
        out.extend([value] * count)
    return out


@dataclass(frozen=True)
class DutyCyclePrediction:
    """Slowdown predicted from duty cycles for one N."""

    n: int
    pods_per_node: float
    p_overlap: float
    """P(>=2) on a node with K = N R / M pods at the mean duty cycle."""
    slowdown: float
    """Predicted T_N / T_1."""

    @property
    def throughput(self) -> float:
        return self.n / self.slowdown


def _stretch_pmf(others: float, duty: float, cpus: float, mem_streams: float) -> dict[float, float]:
    """Distribution of one rank's compute stretch max(1, (1 + j) / B, (1 + j) / C).

    j ~ Binomial(others, duty) is how many other pods on its node compute at the same
    time; a fractional number of others mixes floor and ceil so the mean is right.
    """
    lo = math.floor(others)
    frac = others - lo
    pmf: dict[float, float] = {}
    for k, w in ((lo, 1.0 - frac), (lo + 1, frac)):
        if w <= 0:
            continue
        if k > _EXACT_BINOMIAL_MAX:  # math.comb would overflow a float: scipy's pmf
            _add_binomial(pmf, k, w, duty, cpus, mem_streams)
            continue
        for j in range(k + 1):
            p = w * math.comb(k, j) * duty**j * (1.0 - duty) ** (k - j)
            s = max(1.0, (1.0 + j) / mem_streams, (1.0 + j) / cpus)
            pmf[s] = pmf.get(s, 0.0) + p
    return pmf


_EXACT_BINOMIAL_MAX = 1000
"""Up to this many other pods the binomial terms are computed exactly with math.comb."""


def _add_binomial(
    pmf: dict[float, float], k: int, w: float, duty: float, cpus: float, mem_streams: float
) -> None:
    from scipy.stats import binom

    j = np.arange(k + 1, dtype=np.float64)
    probs = w * binom.pmf(j, k, duty)
    stretch = np.maximum(1.0, np.maximum((1.0 + j) / mem_streams, (1.0 + j) / cpus))
    keep = probs > 0
    for s, p in zip(stretch[keep].tolist(), probs[keep].tolist(), strict=True):
        pmf[s] = pmf.get(s, 0.0) + p


def _expected_slowest_compute(duty_cycles: Sequence[float], pmf: dict[float, float]) -> float:
    """E[max_i d_i s_i] with the s_i independent, each distributed as ``pmf``."""
    stretches = np.array(sorted(pmf))
    probs = np.array([pmf[s] for s in stretches])
    cum = np.cumsum(probs)
    distinct, counts = np.unique(np.asarray(duty_cycles, dtype=np.float64), return_counts=True)
    values = np.unique(np.outer(distinct, stretches))
    # P(max <= v) = prod_i P(s_i <= v / d_i); equal duty cycles give equal factors
    cdf = np.ones_like(values)
    for d, c in zip(distinct.tolist(), counts.tolist(), strict=True):
        if d == 0:
            continue
        idx = np.searchsorted(stretches, values / d * (1 + 1e-12), side="right") - 1
        cdf *= np.where(idx >= 0, cum[np.clip(idx, 0, None)], 0.0) ** c
    mass = np.diff(np.concatenate(([0.0], cdf)))
    return float(np.dot(values, mass))


MAX_PREDICTOR_WORK = 2e8
"""Array elements the duty-cycle predictor may touch for one N = 1..n_max sweep (~seconds)."""


def predictor_work(n_max: int, duty_cycles: Sequence[float], shape: ClusterShape) -> float:
    """Rough element count of predicting N = 1..n_max: distinct duty cycles squared times
    the stretch values, summed over N (pods per node grow with N)."""
    distinct = len(set(duty_cycles))
    per_node = shape.ranks / shape.nodes
    stretches = n_max + per_node * n_max * (n_max + 1) / 2
    return float(distinct) * distinct * stretches + 50.0 * stretches + n_max * len(duty_cycles)


def check_predictor_size(n_max: int, duty_cycles: Sequence[float], shape: ClusterShape) -> None:
    """Refuse a duty-cycle prediction that would run for minutes (one line, before starting)."""
    if predictor_work(n_max, duty_cycles, shape) > MAX_PREDICTOR_WORK:
        raise InvalidQuantity(
            f"the duty-cycle predictor for N = 1..{n_max} with {len(set(duty_cycles))} "
            f"distinct {{duty_cycles}} and {shape.ranks / shape.nodes:g} rank pods per node "
            "would take too long; lower {max_n} or give fewer distinct duty cycles "
            "(groups like 8x0.05)"
        )


def predict_from_duty_cycles(
    n: int,
    duty_cycles: Sequence[float],
    shape: ClusterShape,
    *,
    mem_streams: float = 1.0,
) -> DutyCyclePrediction:
    """T_N / T_1 from per-rank duty cycles, with no calibration run.

    One iteration of a bulk-synchronous solver lasts as long as the slowest rank's
    compute phase plus the communication, which we hold fixed: normalized to the
    single-simulation iteration, T = max_i d_i s_i + (1 - max_i d_i). Rank i's compute
    is stretched by s_i = max(1, (1 + j) / min(B, C)) when j other pods on its node
    compute at the same time; its node holds K_N - 1 other pods (K_N = N R / M), each
    computing with probability d-bar (the mean duty cycle), independently. B =
    ``mem_streams`` is how many ranks a node's memory bandwidth feeds at full speed
    (B = 1: a fully bandwidth-bound stencil code); C bounds CPU oversubscription. So::

        T_N / T_1 = 1 + E[max_i d_i s_i | K_N] - E[max_i d_i s_i | K_1]
    """
    check_n(n)
    if len(duty_cycles) != shape.ranks:
        raise InvalidQuantity(
            f"{{duty_cycles}} has {len(duty_cycles)} values but {{ranks}} is {shape.ranks}; "
            "give one duty cycle per rank (groups like 8x0.05 allowed)"
        )
    for d in duty_cycles:
        check_duty(d)
    if not math.isfinite(mem_streams) or mem_streams <= 0:
        raise InvalidQuantity(f"{{mem_streams}} must be > 0, got {mem_streams:g}")
    quantities.coefficient(mem_streams, "mem_streams", positive=True)
    d_mean = float(np.mean(duty_cycles))
    cpus = shape.cpus_per_node

    def slowest(k: float) -> float:
        pmf = _stretch_pmf(max(0.0, k - 1.0), d_mean, cpus, mem_streams)
        return _expected_slowest_compute(duty_cycles, pmf)

    k_n = shape.pods_per_node(n)
    slow = 1.0 + slowest(k_n) - slowest(shape.pods_per_node(1))
    return DutyCyclePrediction(
        n=n,
        pods_per_node=k_n,
        p_overlap=p_overlap(k_n, d_mean),
        slowdown=slow,
    )


def implied_beta(predictions: Sequence[DutyCyclePrediction], shape: ClusterShape) -> float:
    """Least-squares beta of the linear model through the predicted T_N / T_1 (N >= 2)."""
    xs = [shape.delta_rho(p.n) for p in predictions if p.n > 1]
    ys = [p.slowdown - 1.0 for p in predictions if p.n > 1]
    if not xs:
        raise UserError("implied beta needs predictions for at least one N >= 2")
    x = np.array(xs)
    return float(np.dot(x, np.array(ys)) / np.dot(x, x))
