"""The physical limit of co-location: a work-conserving bound on the throughput gain.

A simulation run alone takes ``T1`` seconds and, while it runs, computes on ``C1`` cores
(``C1 = sum_i d_i * s_i`` over its ranks: rank i computes a fraction ``d_i`` of the wall
time, its duty cycle, at a CPU rate of ``s_i`` cores; ``s_i = 1`` for a rank with a core of
its own). Its useful work is ``W = C1 * T1`` CPU-seconds. N simulations run together on
``P`` cores:

* the node can do at most ``P`` CPU-seconds of work per second, so the N of them need at
  least ``N * W / P = N * C1 * T1 / P`` seconds (this assumes waiting costs no CPU, i.e.
  ideally polite waiting, and that co-location does not inflate the work itself: caches
  and memory bandwidth are free; both only make the real makespan longer);
* none of them finishes faster than alone: at least ``T1`` seconds.

Running them one after the other takes ``N * T1``, so the gain of co-location is at most::

    gain_limit(N) = N * T1 / max(T1, N * C1 * T1 / P) = min(N, P / C1)

It does not depend on ``T1``. ``C1`` is capped at ``P`` (alone, a simulation cannot compute
on more cores than there are), so ``gain_limit(1) = 1``; ``C1 = 0`` gives ``N``. With
simulations that differ (``T_j``, ``C_j``), the same two bounds give
``sum_j T_j / max(max_j T_j, sum_j C_j T_j / P)`` (`mixed_gain_limit`).

Example (FACTS.md): two 2-rank pitzDaily simulations, cells weighted 1:3, each computing on
~1.33 cores of a 2-core machine: ``min(2, 2 / 1.33) = 1.5``; measured with polite waiting:
1.30x. See docs/controller.md ("The physical limit"). Pure; called by the multiplex
session summary and ``rankpack model``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankpack.errors import UserError
from rankpack.model.shape import ClusterShape


def _check_cores(name: str, value: float, *, positive: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        rel = "> 0" if positive else ">= 0"
        raise UserError(f"{name} must be a finite number of cores {rel}, got {value:g}")


def rank_compute_cores(duty: float, cpu_cores: float, wait_mode: str = "spin") -> float:
    """Cores rank i computes on, from one run alone: its duty cycle ``duty`` (wall fraction
    outside MPI) and its mean CPU use ``cpu_cores`` (CPU-seconds / wall seconds).

    Spinning waits (``spin``) keep the rank on its CPU all the time, so its CPU rate while it
    runs is ``cpu_cores`` and it computes on ``duty * cpu_cores``. Polite or adaptive waits
    give the CPU back, so ``cpu_cores`` is already mostly compute (plus the back-off's short
    spins): ``min(duty, cpu_cores)``, both upper bounds for a one-thread rank.
    """
    if not math.isfinite(duty) or not 0 <= duty <= 1:
        raise UserError(f"a duty cycle must be a fraction between 0 and 1, got {duty:g}")
    _check_cores("a rank's CPU use", cpu_cores)
    if wait_mode in ("spin", "auto"):
        return duty * cpu_cores
    return min(duty, cpu_cores)


def compute_cores(
    duties: Sequence[float], cpu_cores: Sequence[float], wait_mode: str = "spin"
) -> float:
    """C1: the cores one simulation computes on when alone (sum of `rank_compute_cores`)."""
    if len(duties) != len(cpu_cores) or not duties:
        raise UserError("give one duty cycle and one CPU use per rank (at least one rank)")
    return sum(rank_compute_cores(d, c, wait_mode) for d, c in zip(duties, cpu_cores, strict=True))


def gain_limit(n: int, compute_cores_alone: float, capacity_cores: float) -> float:
    """min(N, P / C1): no N identical co-located simulations beat this gain over running them
    one after another (see the module docstring for the derivation)."""
    if n < 1:
        raise UserError(f"the number of simulations must be >= 1, got {n}")
    _check_cores("the capacity", capacity_cores, positive=True)
    _check_cores("a simulation's compute", compute_cores_alone)
    c1 = min(compute_cores_alone, capacity_cores)
    if c1 == 0:
        return float(n)
    return min(float(n), capacity_cores / c1)


@dataclass(frozen=True)
class SingleRun:
    """One simulation as it ran alone: wall time and the cores it computed on."""

    t1_s: float
    compute_cores: float


def mixed_gain_limit(sims: Sequence[SingleRun], capacity_cores: float) -> float:
    """sum T_j / max(max T_j, sum C_j T_j / P): the bound for simulations that differ."""
    if not sims:
        raise UserError("give at least one simulation")
    _check_cores("the capacity", capacity_cores, positive=True)
    for s in sims:
        if not math.isfinite(s.t1_s) or s.t1_s <= 0:
            raise UserError(f"a single-run time must be > 0 s, got {s.t1_s:g}")
        _check_cores("a simulation's compute", s.compute_cores)
    sequential = sum(s.t1_s for s in sims)
    work = sum(min(s.compute_cores, capacity_cores) * s.t1_s for s in sims)
    return sequential / max(max(s.t1_s for s in sims), work / capacity_cores)


def limit_from_duty_cycles(n: int, duty_cycles: Sequence[float], shape: ClusterShape) -> float:
    """`gain_limit` for N simulations of ``shape`` (R ranks on M nodes of C vCPUs) from their
    per-rank duty cycles: alone, each rank runs at ``min(1, C / (R / M))`` cores (a core of
    its own unless its node holds more ranks than vCPUs), so ``C1 = that x sum_i d_i`` on
    ``P = M x C`` cores."""
    if len(duty_cycles) != shape.ranks:
        raise UserError(
            f"give one duty cycle per rank: {len(duty_cycles)} values for {shape.ranks} ranks"
        )
    per_rank = min(1.0, shape.cpus_per_node * shape.nodes / shape.ranks)
    c1 = compute_cores(duty_cycles, [per_rank] * shape.ranks, "spin")
    return gain_limit(n, c1, shape.cpus_per_node * shape.nodes)
