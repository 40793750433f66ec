"""Single-run baselines: what a session's simulations take one after another, like for like.

A session's gain compares each of its simulations with recorded single runs (completed,
outside any multiplex session) of the same key (`config_key`): case, ranks, iterations,
decomposition, budget, weights, wait setting, backend, and how the run *started*
(``start`` in its options, `rankpack.controller.learned.start_of`): at sizes learned from
an earlier run (``learned``: no profiling window), at its plan and profiled live
(``profiled``), or at its plan for good (``plan``). The start matters: 4 ranks of a
1:1:5:15 plan on equal subdomains spend the warm-up and profiling window at requests that
starve their light ranks, and a copy that starts at learned sizes runs without it (the
user-sized case: 23.2 s alone profiled against 18.4 s learned, issue 42); so a run that
started learned is compared only with single runs that started learned. Runs recorded
before the start was (no ``start``) are a baseline for none.

`measure_baselines` runs what is missing before a session, alone and through the same
loop and settings: when the session's runs will start at learned sizes and nothing is
learned yet, a first run alone is profiled and teaches them, then the baseline run starts
from them, as the queued runs will. `throughput_limit` is the physical bound on the gain
(`rankpack.model.limit`) from the same single runs' duty cycles and CPU use. Called by
`rankpack.controller.session` and `rankpack multiplex`.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rankpack.backend.protocol import Backend
from rankpack.controller.jobs import OneJob
from rankpack.controller.learned import learnable, learned_sizes, start_of
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.controller.views import SimOutcome
from rankpack.model.limit import SingleRun, compute_cores, mixed_gain_limit
from rankpack.plan.submission import Submission
from rankpack.store import RunRow, Store


def config_key(r: RunRow) -> tuple[Any, ...]:
    o = r.options
    return (
        r.case_name, r.n_ranks, o.get("iterations"), r.decompose, r.total_millis,
        tuple(o.get("weights") or ()), o.get("wait_mode", "spin"), r.backend, o.get("start"),
    )  # fmt: skip


def submission_key(sub: Submission, wait_mode: str, backend: str, start: str) -> tuple[Any, ...]:
    """The key of the single runs that are a baseline for ``sub`` started so (`config_key`)."""
    return (
        Path(sub.case).name, sub.n_ranks, sub.iterations, sub.decompose,
        sub.plan().total_millis, tuple(sub.weights), wait_mode, backend, start,
    )  # fmt: skip


def single_runs(runs: list[RunRow], key: tuple[Any, ...]) -> list[RunRow]:
    """Recorded single (non-multiplexed) completed runs with this key."""
    return [
        r
        for r in runs
        if r.status == "completed"
        and "multiplex_id" not in r.options
        and config_key(r) == key
        and r.wall_s
    ]


def baseline_for_key(runs: list[RunRow], key: tuple[Any, ...]) -> float | None:
    """Median wall time of recorded single (non-multiplexed) completed runs with this key."""
    walls = [r.wall_s for r in single_runs(runs, key) if r.wall_s]
    return statistics.median(walls) if walls else None


@dataclass(frozen=True)
class Baseline:
    """The single runs one simulation of a session is compared with."""

    run_ids: tuple[int, ...]
    wall_s: float
    """Their median wall time (launch to end)."""
    cpu_s: float | None
    """Their median CPU-seconds (all ranks)."""
    start: str | None
    """How they (and the simulation) started: learned, profiled, plan."""
    wait_modes: frozenset[str] | None
    """The wait modes their ranks ran in (None: a run recorded before launches recorded
    theirs)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": list(self.run_ids), "wall_s": self.wall_s, "cpu_s": self.cpu_s,
            "start": self.start,
            "wait_modes": sorted(self.wait_modes) if self.wait_modes is not None else None,
        }  # fmt: skip


def run_wait_modes(store: Store, run_id: int) -> frozenset[str] | None:
    """The wait modes a recorded run's ranks ran in: at launch, then each switch."""
    events = store.events(run_id=run_id)
    launch = next((e for e in events if e.kind == "launch"), None)
    if launch is None or "wait_mode" not in launch.detail:
        return None
    modes = {str(launch.detail["wait_mode"])}
    modes |= {str(e.detail["mode"]) for e in events if e.kind == "wait-mode" and "mode" in e.detail}
    return frozenset(modes)


def baseline_of(store: Store, runs: list[RunRow], run: RunRow) -> Baseline | None:
    singles = single_runs(runs, config_key(run))
    if not singles:
        return None
    modes: set[str] | None = set()
    for r in singles:
        found = run_wait_modes(store, r.id)
        modes = None if found is None or modes is None else modes | found
    cpus = [r.cpu_s for r in singles if r.cpu_s]
    return Baseline(
        run_ids=tuple(r.id for r in singles),
        wall_s=statistics.median(r.wall_s or 0.0 for r in singles),
        cpu_s=statistics.median(cpus) if cpus else None,
        start=run.options.get("start"),
        wait_modes=frozenset(modes) if modes is not None else None,
    )


def baselines(store: Store, done: list[SimOutcome]) -> dict[int, Baseline | None]:
    """Each completed simulation's baseline by run id (None: no like-for-like single run)."""
    runs = store.all_runs()
    return {s.id: baseline_of(store, runs, store.get_run(s.id)) for s in done}


def sequential_s(store: Store, done: list[SimOutcome]) -> tuple[float | None, str]:
    """Time to run the same simulations one after another, from recorded single runs."""
    found = baselines(store, done)
    if any(b is None for b in found.values()):
        return None, "missing"
    return sum(b.wall_s for b in found.values() if b is not None), "db"


def single_run_compute(store: Store, runs: list[RunRow], key: tuple[Any, ...]) -> SingleRun | None:
    """Median single-run time and the cores the simulation computed on alone (C1, mean over
    the single runs with a duty cycle for every rank), or None without such runs."""
    wall = baseline_for_key(runs, key)
    c1s = []
    for r in single_runs(runs, key):
        full = store.get_run(r.id)
        if not full.ranks or any(k.duty is None for k in full.ranks) or not full.wall_s:
            continue
        duties = [float(k.duty or 0.0) for k in full.ranks]
        cpu = [(k.cpu_s or 0.0) / full.wall_s for k in full.ranks]
        c1s.append(compute_cores(duties, cpu, str(full.options.get("wait_mode", "spin"))))
    if wall is None or not c1s:
        return None
    return SingleRun(wall, statistics.fmean(c1s))


def throughput_limit(
    store: Store, done: list[SimOutcome], capacity_millis: int, *, as_gate: bool = False
) -> float | None:
    """The work-conserving bound on the gain of these simulations on this capacity.

    ``as_gate``: count a simulation with more ranks than cores as computing on all of them,
    as the launch gate does (its ranks' waits are mostly waits for a core)."""
    runs = store.all_runs()
    singles = []
    for s in done:
        run = store.get_run(s.id)
        single = single_run_compute(store, runs, config_key(run))
        if single is None:
            return None
        if as_gate and run.n_ranks * 1000 > capacity_millis:
            single = SingleRun(single.t1_s, capacity_millis / 1000)
        singles.append(single)
    if not singles or capacity_millis <= 0:
        return None
    return mixed_gain_limit(singles, capacity_millis / 1000)


def expected_start(sub: Submission) -> str:
    """How a session's runs of ``sub`` start once a single run of it was recorded: at its
    learned sizes when it can learn them, else as `start_of` says."""
    return "learned" if learnable(sub) else start_of(sub, None)


def measure_baselines(
    backend: Backend,
    store: Store,
    settings: LoopSettings,
    *,
    force: bool,
    stop: threading.Event | None = None,
    on_measure: Callable[[Submission, str], None] | None = None,
) -> None:
    """Run each distinct queued simulation alone once (the session's settings, one at a
    time) unless the database already has such a run that started as the session's runs
    will, so the gain compares like with like. ``on_measure(sub, why)`` is told of each run
    before it starts: ``learn`` (a first run alone, profiled, to learn the sizes the
    baseline and the session's runs start at) or ``baseline``."""
    seen: set[str] = set()
    alone = replace(settings, controller=replace(settings.controller, max_concurrent=1))
    c = settings.controller
    for row in store.queue():
        sub = Submission.from_json(row.options)
        key = json.dumps(sub.to_json(), sort_keys=True)
        if key in seen or (stop is not None and stop.is_set()):
            continue
        seen.add(key)
        start = expected_start(sub)
        wanted = submission_key(sub, settings.wait_mode, backend.name, start)
        if not force and baseline_for_key(store.all_runs(), wanted) is not None:
            continue

        def learned(sub: Submission = sub) -> bool:
            found = learned_sizes(store, sub, backend.name, headroom=c.headroom,
                                  floor_millis=c.floor_millis)  # fmt: skip
            return found is not None

        if start == "learned" and not learned():
            _alone(backend, store, sub, alone, "baseline-learn", stop, on_measure)
            if (stop is not None and stop.is_set()) or not learned():
                continue  # nothing learned: the session's runs start profiled, like it did
        _alone(backend, store, sub, alone, "baseline", stop, on_measure)


def _alone(
    backend: Backend, store: Store, sub: Submission, settings: LoopSettings, label: str,
    stop: threading.Event | None, on_measure: Callable[[Submission, str], None] | None,
) -> None:  # fmt: skip
    if on_measure is not None:
        on_measure(sub, "learn" if label == "baseline-learn" else "baseline")
    run_jobs(
        backend, store, OneJob(sub),
        replace(settings, label=label, extra={**settings.extra, "baseline": True}), stop=stop,
    )  # fmt: skip
