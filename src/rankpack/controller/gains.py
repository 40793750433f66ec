"""What the launch gate's throughput models predict of one more simulation (pure).

Part of the decision step: the launch gate (`rankpack.controller.gate`) asks
`predicted_gain` whether the head of the queue is worth launching beside what runs, and its
pipeline asks `speed` over `limit_loads`. The models: ``limit`` (the work-conserving bound
of `rankpack.model.limit` x ``colocation_efficiency``, `_limit_gain`), ``duty`` (the
duty-cycle overlap predictor of `rankpack.model.overlap`: N = running count, R = max(ranks
of the head and of the running simulations), one node of capacity / 1000 vCPUs, duty
cycles = per rank index the mean of the running simulations' duties (a ``scheduled`` one
uses its cumulative shim ratio, or 1.0 without shim data), padded with the overall mean to
R; throughput(n) = n / slowdown(n) from `predict_from_duty_cycles`, and a launch needs
throughput(N+1) >= (1 + ``min_predicted_gain``) x throughput(N)), ``beta`` (seed 001's linear
model with ``fitted_beta``), ``off`` (always a gain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankpack.controller.decision import ControllerSettings, QueuedSim, SimMemory, SimSnapshot
from rankpack.controller.step import Step
from rankpack.model.contention import throughput
from rankpack.model.overlap import predict_from_duty_cycles
from rankpack.model.shape import ClusterShape


def _compute(duties: Sequence[float], ranks: int, cores: float, spin: bool) -> float:
    """The cores a simulation computes on alone (`_limit_gain`)."""
    if spin or ranks > cores:
        return min(float(ranks), cores)
    return sum(min(1.0, max(0.0, d)) for d in duties)


def speed(loads: Sequence[float], cores: float, s: ControllerSettings) -> float:
    """X(S): simulations' worth of single-run speed of the set with these loads."""
    if not loads:
        return 0.0
    total = sum(loads)
    eta = 1.0 if len(loads) < 2 else s.colocation_efficiency
    return eta * len(loads) * (1.0 if total <= cores else cores / total)


def model_name(s: ControllerSettings) -> str:
    if s.gate == "beta" and s.fitted_beta is not None:
        return f"the linear contention model (beta {s.fitted_beta:.3f})"
    if s.gate == "duty":
        return "the duty-cycle model"
    return f"the physical limit x efficiency {s.colocation_efficiency:.2f}"


def _running_duties(sim: SimSnapshot, mem: SimMemory) -> list[float]:
    if mem.stage == "sized" and len(mem.duty) == len(sim.ranks):
        return list(mem.duty)
    return list(sim.counter_duties)


def predicted_gain(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
    """throughput(N+1) / throughput(N) from the settings' gate model, or None if not
    computable."""
    s = step.settings
    if s.gate == "off":
        return math.inf
    if s.gate == "beta" and s.fitted_beta is not None:
        shape = _shape(step, memory, head)
        if shape is None:
            return None
        n = len(step.obs.sims)
        return throughput(n + 1, s.fitted_beta, shape) / throughput(n, s.fitted_beta, shape)
    if s.gate == "duty":
        return _duty_model_gain(step, memory, head)
    return _limit_gain(step, memory, head)


def _shape(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> ClusterShape | None:
    per_sim = [_running_duties(sim, memory[sim.sim_id]) for sim in step.obs.sims]
    ranks = max([head.n_ranks, *(len(d) for d in per_sim)])
    if ranks < 1 or step.obs.capacity_millis <= 0:
        return None
    return ClusterShape(ranks=ranks, nodes=1, cpus_per_node=step.obs.capacity_millis / 1000)


def _duty_model_gain(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
    """The duty-cycle overlap predictor (`predict_from_duty_cycles`)."""
    obs = step.obs
    per_sim = [_running_duties(sim, memory[sim.sim_id]) for sim in obs.sims]
    all_duties = [d for ds in per_sim for d in ds]
    shape = _shape(step, memory, head)
    if shape is None or not all_duties:
        return None
    mean = sum(all_duties) / len(all_duties)
    duties = []
    for i in range(shape.ranks):
        column = [ds[i] for ds in per_sim if i < len(ds)]
        duties.append(sum(column) / len(column) if column else mean)
    duties = [min(1.0, max(0.0, d)) for d in duties]
    n = len(obs.sims)
    now = predict_from_duty_cycles(n, duties, shape)
    then = predict_from_duty_cycles(n + 1, duties, shape)
    return then.throughput / now.throughput


def _limit_gain(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
    """The work-conserving bound (`rankpack.model.limit`) with the co-location efficiency.

    Simulation j computes on ``C_j = sum_i d_i`` cores when alone (rank i's duty cycle d_i,
    a core per rank). A simulation with more ranks than the P cores counts as filling them,
    ``C_j = P``: alone, its ranks' waits are mostly waits for a core its own other ranks
    hold, not free capacity (docs/benchmarks.md: 4-rank pitzDaily pairs on 2 cores gained
    0.71-0.96x with polite waiting). A set S of
    simulations then runs at ``X(S) = |S| x min(1, P / sum_j C_j)`` simulations' worth of
    single-run speed (fair sharing of the cores once their compute exceeds them; waiting
    costs nothing). Spinning waits cost a core: under a fixed ``spin`` mode ``C_j`` is the
    cores its ranks occupy, ``min(R_j, P)``. The head's duty cycles are its
    learned ones, else the running simulations' mean per rank. Prediction:
    ``eta(S+h) X(S+h) / (eta(S) X(S))`` with eta = ``colocation_efficiency`` for two or
    more simulations together and 1 for one alone.
    """
    obs, s = step.obs, step.settings
    if obs.capacity_millis <= 0 or not obs.sims:
        return None
    loads = limit_loads(step, memory)
    mine = loads.of(head)
    return speed([*loads.running, mine], loads.cores, s) / speed(loads.running, loads.cores, s)


@dataclass(frozen=True)
class LimitLoads:
    """What the limit gate counts of the simulations running, once per step."""

    running: list[float]
    """Per simulation, the cores it computes on alone (`_compute`)."""
    mean_duty: float
    """The running ranks' mean duty cycle (the head's, when it has none of its own)."""
    cores: float
    spin: bool

    def of(self, queued: QueuedSim) -> float:
        """The head's load: its learned duty cycles, else the running ones' mean."""
        duty = queued.duty if len(queued.duty) == queued.n_ranks else (
            [self.mean_duty] * queued.n_ranks)  # fmt: skip
        return _compute(duty, queued.n_ranks, self.cores, self.spin)


def limit_loads(step: Step, memory: dict[str, SimMemory]) -> LimitLoads:
    """Once per step; each simulation's duty sums are kept by the memory (sized) or the
    snapshot (measured) they come from, so a step costs a sum per simulation, not per
    rank: the same values as summing its duties here."""
    cached = step.memo.get("limit-loads")
    if isinstance(cached, LimitLoads):
        return cached
    obs = step.obs
    cores = obs.capacity_millis / 1000
    spin = any(sim.wait == "spin" for sim in obs.sims)
    sums = [_duty_sums(sim, memory[sim.sim_id]) for sim in obs.sims]
    running = [
        min(float(len(sim.ranks)), cores) if spin or len(sim.ranks) > cores else clamped
        for (_, clamped, _), sim in zip(sums, obs.sims, strict=True)
    ]  # `_compute` of its duties
    flat = sum(total for total, _, _ in sums), sum(n for _, _, n in sums)
    loads = LimitLoads(running, flat[0] / max(1, flat[1]), cores, spin)
    step.memo["limit-loads"] = loads
    return loads


def _duty_sums(sim: SimSnapshot, mem: SimMemory) -> tuple[float, float, int]:
    """(sum, sum clamped to [0, 1], count) of `_running_duties`."""
    if mem.stage == "sized" and len(mem.duty) == len(sim.ranks):
        return mem.duty_sums
    return sim.counter_duty_sums
