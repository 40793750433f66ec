"""Multiplex sessions: the queue run by the control loop, and what a session is worth.

`run_session` records a session, runs the store's queue through the one control loop and
summarises it (`summarise`, `SessionResult`): makespan, the time the same simulations take
one after another from recorded single runs that started as they did (the baseline,
`rankpack.controller.baselines`), the co-location gain, fairness, and what else made the
session differ from those single runs, named apart and not in the gain (idle stretches,
staging ahead, a wait mode the single runs never used: `rankpack.controller.effects`).
`choose_gate` decides how launches are gated (a contention coefficient fitted on this
machine's recorded sessions, or the physical limit times a learned efficiency). Called by
`rankpack multiplex` (`rankpack.cli.multiplex_cmd`); the operator runs the same loop but
records its sessions itself (`rankpack.operator.service`).
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rankpack.backend.protocol import Backend
from rankpack.controller.baselines import Baseline, baselines, throughput_limit
from rankpack.controller.decision import (
    DEFAULT_COLOCATION_EFFICIENCY,
    ControllerSettings,
    GateModel,
)
from rankpack.controller.effects import Effects, SimSpans, session_effects
from rankpack.controller.jobs import StoreQueue
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.controller.views import Display, LoopResult, SimOutcome
from rankpack.errors import UserError
from rankpack.plan.submission import Submission
from rankpack.store import RunRow, SessionRow, Store


@dataclass(frozen=True)
class SessionResult:
    """What a multiplex session was worth; `to_json` is its recorded summary (the store's
    session row, `rankpack multiplex --json`, the report, a dashboard). Seconds ``*_s``;
    the gain counts co-location alone, and every other effect has a field of its own."""

    multiplex_id: int
    status: str
    makespan_s: float
    """First launch to last end (idle stretches included)."""
    sequential_s: float | None
    """The same simulations one after another: the sum of each one's baseline (the median
    wall time of its single runs that started as it did, `baselines`); None without one."""
    throughput_gain: float | None
    """Co-location's gain: ``sequential_s / busy_s`` (1: as fast as one after another).
    Neither side counts staging, nor idle stretches; the other effects are below."""
    baseline_source: str
    """db (every simulation has a baseline), missing (one has none that started as it
    did: ``baseline_note`` says which), none (not asked for, or the session did not
    complete)."""
    fairness_ratio: float | None
    resizes: int
    restarts: int
    max_concurrent_seen: int
    """The most simulations that ran at once (1: never co-located; a gain is then noise)."""
    simulations: tuple[SimOutcome, ...]
    resizes_rejected: int = 0
    launch_failures: tuple[dict[str, Any], ...] = ()
    throughput_limit: float | None = None
    """The most any co-location of these simulations could gain on this capacity
    (work-conserving bound from their single runs); None without single runs with duty
    cycles."""
    gate_limit: float | None = None
    """The same bound as the launch gate counts it (a simulation with more ranks than cores
    fills them: `rankpack.controller.gate._limit_gain`); the gate learns its efficiency as
    gain / this, so that what it learns is applied to the limit it was learned against."""
    busy_s: float = 0.0
    """Seconds from the first launch to the last end with at least one simulation running:
    the gain's denominator."""
    idle_s: float = 0.0
    """``makespan_s - busy_s``: none running (a case still staging, a launch not made);
    not in the gain."""
    staged_ahead_s: float = 0.0
    """Seconds of the simulations' staging done while another of them ran (hidden from the
    makespan; it took CPU from the run beside it); not in the gain."""
    other_wait_s: float = 0.0
    """Seconds a simulation ran alone with its ranks in a wait mode its single runs never
    used (not co-location's doing)."""
    other_effects: tuple[str, ...] = ()
    """Each effect other than co-location, in words (empty: none seen)."""
    baselines: tuple[dict[str, Any], ...] = ()
    """Per completed simulation: ``id``, how it started (``start``) and its baseline (the
    single ``runs``, their median ``wall_s`` and ``cpu_s``, the ``wait_modes`` they used),
    or ``runs`` empty when it has none."""
    baseline_note: str = ""
    """Why there is no baseline (``baseline_source`` missing), else ''."""

    def to_json(self) -> dict[str, Any]:
        return {
            "multiplex_id": self.multiplex_id,
            "status": self.status,
            "makespan_s": self.makespan_s,
            "sequential_s": self.sequential_s,
            "throughput_gain": self.throughput_gain,
            "throughput_limit": self.throughput_limit,
            "gate_limit": self.gate_limit,
            "baseline": self.baseline_source,
            "baseline_note": self.baseline_note,
            "busy_s": self.busy_s,
            "idle_s": self.idle_s,
            "staged_ahead_s": self.staged_ahead_s,
            "other_wait_s": self.other_wait_s,
            "other_effects": list(self.other_effects),
            "baselines": list(self.baselines),
            "fairness_ratio": self.fairness_ratio,
            "resizes": self.resizes,
            "resizes_rejected": self.resizes_rejected,
            "restarts": self.restarts,
            "max_concurrent_seen": self.max_concurrent_seen,
            "simulations": [asdict(s) for s in self.simulations],
            "launch_failures": list(self.launch_failures),
        }


def run_session(
    backend: Backend,
    store: Store,
    settings: LoopSettings,
    *,
    baseline: str = "auto",
    display: Display | None = None,
    stop: threading.Event | None = None,
) -> SessionResult:
    """Run the queue until it is empty (or stopped) as one recorded multiplex session."""
    capacity = settings.capacity_millis or backend.inventory().allocatable_millis
    settings = open_session(store, backend.name, settings, capacity)
    multiplex_id = settings.multiplex_id
    assert multiplex_id is not None
    store.add_event(None, "start", {"capacity_millis": capacity,
                    "max_concurrent": settings.controller.max_concurrent,
                    "wait_mode": settings.wait_mode, "backend": backend.name},
                    multiplex_id=multiplex_id, t_s=0.0)  # fmt: skip
    loop = run_jobs(
        backend, store, StoreQueue(store, multiplex_id), settings, display=display, stop=stop
    )
    result = summarise(store, multiplex_id, loop, baseline, capacity_millis=capacity)
    store.finish_multiplex(multiplex_id, result.status, result.to_json())
    store.add_event(None, "end", {"status": result.status,
                    "makespan_s": round(result.makespan_s, 3)},
                    multiplex_id=multiplex_id, t_s=round(result.makespan_s, 3))  # fmt: skip
    return result


def open_session(
    store: Store,
    backend_name: str,
    settings: LoopSettings,
    capacity_millis: int,
    *,
    label: str = "multiplex",
) -> LoopSettings:
    """Record a new multiplex session and return the settings of the loops that run it:
    its id on every event and run (``multiplex_id``, and in each run's options), its
    runs labelled ``<label>-<id>``. The session set-up of `rankpack multiplex` (`run_session`)
    and of its baselines; the operator records its own sessions, as backend
    ``kubernetes-operator``, when it first leads (`rankpack.operator.service`)."""
    multiplex_id = store.start_multiplex(
        capacity_millis, settings.controller.max_concurrent, settings.wait_mode, backend_name
    )
    return replace(
        settings,
        multiplex_id=multiplex_id,
        label=f"{label}-{multiplex_id}",
        extra={**settings.extra, "multiplex_id": multiplex_id},
    )


def summarise(
    store: Store,
    multiplex_id: int,
    loop: LoopResult,
    baseline: str,
    *,
    capacity_millis: int | None = None,
) -> SessionResult:
    sims = loop.outcomes
    done = [s for s in sims if s.status == "completed"]
    makespan = (max(s.finished_s for s in sims) - min(s.started_s for s in sims)) if sims else 0.0
    walls = [s.wall_s for s in done]
    fairness = max(walls) / min(walls) if len(walls) >= 2 and min(walls) > 0 else None
    found: dict[int, Baseline | None] = {}
    if loop.status == "completed" and baseline != "none" and done:
        found = baselines(store, done)
    effects = session_effects([_spans(s, found.get(s.id)) for s in sims])
    sequential, source, note = _sequential(done, found) if found else (None, "none", "")
    busy = effects.busy_s
    gain = sequential / busy if sequential and busy > 0 else None
    limit = gate_limit = None
    if sequential is not None and capacity_millis:
        limit = throughput_limit(store, done, capacity_millis)
        gate_limit = throughput_limit(store, done, capacity_millis, as_gate=True)
    return SessionResult(
        multiplex_id=multiplex_id,
        status=loop.status,
        makespan_s=makespan,
        sequential_s=sequential,
        throughput_gain=gain,
        baseline_source=source,
        fairness_ratio=fairness,
        resizes=loop.resizes,
        restarts=loop.restarts,
        max_concurrent_seen=loop.max_concurrent_seen,
        simulations=sims,
        resizes_rejected=loop.resizes_rejected,
        throughput_limit=limit,
        gate_limit=gate_limit,
        launch_failures=tuple(
            {"queue_id": f.queue_id, "case": f.case, "reason": f.reason, "failure": f.failure.value}
            for f in loop.stage_failures
        ),
        **_effect_fields(effects),
        baselines=tuple(
            {"id": s.id, "start": s.start, **_baseline_json(found.get(s.id))} for s in done
        ) if found else (),
        baseline_note=note,
    )  # fmt: skip


def _spans(s: SimOutcome, base: Baseline | None) -> SimSpans:
    staging = None
    if s.staging_from_s is not None and s.staged_s is not None:
        staging = (s.staging_from_s, s.staged_s)
    return SimSpans(
        s.id, (s.started_s, s.finished_s), staging, s.waits,
        base.wait_modes if base is not None else None,
    )  # fmt: skip


def _effect_fields(e: Effects) -> dict[str, Any]:
    return {"busy_s": e.busy_s, "idle_s": e.idle_s, "staged_ahead_s": e.staged_ahead_s,
            "other_wait_s": e.other_wait_s, "other_effects": e.notes}  # fmt: skip


def _baseline_json(b: Baseline | None) -> dict[str, Any]:
    if b is None:
        return {"runs": [], "wall_s": None, "cpu_s": None, "wait_modes": None}
    data = b.to_json()
    data.pop("start")
    return data


def _sequential(
    done: list[SimOutcome], found: dict[int, Baseline | None]
) -> tuple[float | None, str, str]:
    """(one after another, source, why missing)."""
    missing = [s for s in done if found.get(s.id) is None]
    if missing:
        s = missing[0]
        how = {"learned": "at learned sizes", "profiled": "at its plan, profiled",
               "plan": "at its plan"}.get(s.start, "as it did")  # fmt: skip
        return None, "missing", (
            f"no completed single run of run {s.id}'s simulation that started {how}, as "
            "it did (`rankpack multiplex --baseline auto` measures one)"
        )  # fmt: skip
    return sum(b.wall_s for b in found.values() if b is not None), "db", ""


# -- the launch gate -----------------------------------------------------------------------


def fitted_beta_from_sessions(
    sessions: list[SessionRow], *, capacity_millis: int, wait_mode: str, n_ranks: int
) -> float | None:
    """beta fitted on the recorded sessions comparable with this one (same capacity, wait
    mode and ranks per simulation), or None when they do not give two distinct N."""
    from rankpack.model.contention import fit_beta, points_from_sessions
    from rankpack.model.shape import ClusterShape

    comparable = [
        {"status": m.status, "summary": m.summary}
        for m in sessions
        if m.capacity_millis == capacity_millis and m.wait_mode == wait_mode
        and all(s.get("n_ranks") == n_ranks for s in m.summary.get("simulations", []))
    ]  # fmt: skip
    points = points_from_sessions(comparable)
    if len(points) < 2 or points[0].n != 1:
        return None
    shape = ClusterShape(ranks=n_ranks, nodes=1, cpus_per_node=capacity_millis / 1000)
    try:
        return fit_beta(points, shape).beta
    except UserError:
        return None


@dataclass(frozen=True)
class GateChoice:
    """How launches are gated (`ControllerSettings.gate` and its parameters) and why."""

    gate: GateModel
    beta: float | None = None
    efficiency: float = DEFAULT_COLOCATION_EFFICIENCY
    source: str = "default"
    """Where the parameter came from, in words."""

    def settings(self, base: ControllerSettings) -> ControllerSettings:
        return replace(base, gate=self.gate, fitted_beta=self.beta,
                       colocation_efficiency=self.efficiency)  # fmt: skip

    def describe(self) -> str:
        if self.gate == "beta":
            return f"launch gate: linear contention model, beta {self.beta:.3f} ({self.source})"
        if self.gate == "limit":
            return f"launch gate: physical limit x efficiency {self.efficiency:.2f} ({self.source})"
        if self.gate == "duty":
            return "launch gate: duty-cycle model"
        return "launch gate: off (launch whenever --max-concurrent allows; requests shrink to fit)"


def workload_key(sub: Submission) -> tuple[Any, ...]:
    """What makes two simulations the same workload for the launch gate: the case (its
    directory name), ranks and decomposition (method, weights); not iterations, requests
    or wait mode."""
    weights = sub.decompose_weights or sub.weights
    return (Path(sub.case).name, sub.n_ranks, sub.decompose, tuple(weights))


PRIOR_SESSIONS = 2
"""How many sessions of a workload the prior of its co-location efficiency counts as
(`learned_efficiency`)."""


def learned_efficiency(
    sessions: list[SessionRow], *, capacity_millis: int, wait_mode: str,
    same_workload: Callable[[SessionRow], bool] | None = None,
) -> tuple[float, int, bool] | None:  # fmt: skip
    """Median of measured gain / physical limit over the recorded sessions comparable with
    this one (completed, same capacity and wait mode, >= 2 simulations at once; a limit
    above 1, or of 1 for the same workload), with how many sessions and whether they were
    of the same workload. The limit is the session's ``gate_limit`` (the bound as the gate
    counts it) where recorded, else its ``throughput_limit`` (older sessions).

    Sessions for which ``same_workload`` is true win: how well co-location works depends
    on the workload (on 2 cores, 0.27 of the limit for 4-rank pitzDaily, 0.6-0.9 for 2-rank
    48 900-cell pairs; docs/benchmarks.md). Their median is weighed against a prior that
    counts as `PRIOR_SESSIONS` sessions: (n x median + k x prior) / (n + k), clamped to
    [0.1, 1]. One pair on a noisy 2-core machine varies by +-10 % (the weighted pair:
    0.66-0.79 of its limit in one session), and a single low one would otherwise close the
    gate for good, since a held workload records no more packed sessions; a workload far
    below the prior is still held after its first session (0.5 against 0.78: 0.69). The
    prior is the machine's median over other workloads, else
    `DEFAULT_COLOCATION_EFFICIENCY`. Without a session of this workload, the machine's
    median over every workload, clamped to [0.5, 1]: a prior, which does not let one bad
    workload close the gate for all others. None without comparable sessions."""
    ratios: list[float] = []
    same: list[float] = []
    others: list[float] = []
    for m in sessions:
        summary = m.summary
        gain = summary.get("throughput_gain")
        limit = summary.get("gate_limit") or summary.get("throughput_limit")
        if not (
            m.status == "completed"
            and m.capacity_millis == capacity_millis
            and m.wait_mode == wait_mode
            and int(summary.get("max_concurrent_seen") or 0) >= 2
            and isinstance(gain, (int, float))
            and isinstance(limit, (int, float))
            and limit >= 1.0
            and gain > 0
        ):
            continue
        ratio = float(gain) / float(limit)
        mine = same_workload is not None and same_workload(m)
        if mine:
            same.append(ratio)  # a limit of 1 too: how much co-locating this workload loses
        if limit > 1.0:
            ratios.append(ratio)
            if not mine:
                others.append(ratio)
    if same:
        prior = _machine_prior(others) if others else DEFAULT_COLOCATION_EFFICIENCY
        n, k = len(same), PRIOR_SESSIONS
        eta = (n * statistics.median(same) + k * prior) / (n + k)
        return min(1.0, max(0.1, eta)), n, True
    if not ratios:
        return None
    return _machine_prior(ratios), len(ratios), False


def _machine_prior(ratios: list[float]) -> float:
    """The median efficiency of these sessions, clamped to [0.5, 1]: a prior that does not
    let one bad workload close the gate for all others."""
    return min(1.0, max(0.5, statistics.median(ratios)))


def _run_workload(r: RunRow) -> tuple[Any, ...] | None:
    try:
        sub = Submission.from_json(r.options)
    except (KeyError, TypeError, ValueError):
        return None  # a run recorded without its submission (an older rankpack)
    return workload_key(sub)


def _same_workload_as(store: Store, head: Submission) -> Callable[[SessionRow], bool]:
    """True for a session whose every simulation ran ``head``'s workload."""
    key = workload_key(head)
    workloads: dict[int, tuple[Any, ...] | None] = {}  # run id -> its workload, read once

    def same(m: SessionRow) -> bool:
        if not workloads:
            workloads.update((r.id, _run_workload(r)) for r in store.all_runs())
        ids = [s.get("id") for s in m.summary.get("simulations", [])]
        return bool(ids) and all(workloads.get(i) == key for i in ids)

    return same


def choose_gate(
    store: Store, head: Submission, *, capacity_millis: int, wait_mode: str,
    beta: float | None, gate: str,
) -> GateChoice:  # fmt: skip
    """The launch gate: ``--beta`` given, or ``gate`` (auto = limit) with its parameter
    learned from this machine's recorded sessions where they exist."""
    if beta is not None:
        return GateChoice("beta", beta, source="given")
    if gate == "beta":
        fitted = fitted_beta_from_sessions(
            store.multiplex_sessions(), capacity_millis=capacity_millis, wait_mode=wait_mode,
            n_ranks=head.n_ranks,
        )  # fmt: skip
        if fitted is None:
            raise UserError(
                "--gate beta needs recorded sessions with 1 and more simulations (same "
                "capacity, wait mode and ranks) to fit beta; give --beta or use --gate limit"
            )
        return GateChoice("beta", fitted, source="fitted from this machine's sessions")
    if gate in ("duty", "off"):
        return GateChoice(gate)  # type: ignore[arg-type]
    found = learned_efficiency(
        store.multiplex_sessions(), capacity_millis=capacity_millis, wait_mode=wait_mode,
        same_workload=_same_workload_as(store, head),
    )  # fmt: skip
    if found is None:
        return GateChoice("limit", source="default, no comparable session recorded yet")
    eta, n, own = found
    sessions = f"{n} recorded session{'s' if n != 1 else ''}"
    source = (
        f"learned from {sessions} of this workload"
        if own
        else f"learned from {sessions} of other workloads on this machine"
    )
    return GateChoice("limit", efficiency=eta, source=source)
