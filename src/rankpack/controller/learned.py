"""Learned sizes: a simulation profiled before starts at the requests it was sized to.

A submission sized by duty cycles (``sizing="duty"``, no phase schedule, requests-only QoS)
whose case, decomposition and number of ranks match a completed run on the same backend
that had the node to itself starts at that run's learned per-rank requests instead of its
plan's (one core per rank by default), so copies of a case fit the node at once and the
launch gate sees their real size.

Only runs recorded as alone (``shared_s`` 0, or a single run recorded before that was
kept) teach sizes: a run that shared the cores measured its sharing, not its load. Beside
another simulation its light ranks wait for a core and its heavy ones for them, so its duty
cycles fall (1:3 pitzDaily: 0.97 alone, 0.66 packed, for the heavy rank) and its split
skews; copies started at such sizes (112m/570m, a 16:84 split) ran at 0.87x of one after
the other. Source, newest matching run first:

1. ``sized``: every rank has a completed resize of kind ``size`` in that run: the last one
   of each rank (what the controller measured and chose then);
2. ``duty``: every rank has a recorded steady-state duty cycle: compute cores =
   `rankpack.model.limit.rank_compute_cores` (duty x CPU-seconds / wall seconds when the
   run spun) x ``headroom``, in millicores, at least the floor.

The requests are capped at the submission's budget (split in proportion, floors kept). With
that run's duty cycles, the policy counts the simulation as ``sized`` from its launch (no
new warm-up and profiling window), so the launch gate need not wait for it to be measured;
fairness adjusts it like any sized simulation. `start_of` names how a run starts (learned,
profiled, or at its plan), recorded with the run. Called by the control loop when it
builds the plan of a job it stages, and for the queue it shows the policy; by the
single-run baselines (`rankpack.controller.baselines`), which start as the session's runs
will.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rankpack.model.limit import rank_compute_cores
from rankpack.plan.allocation import QoS, proportional_millis
from rankpack.plan.submission import Submission
from rankpack.store import RunRow, Store


@dataclass(frozen=True)
class LearnedSizes:
    run_id: int
    """The run they were learned from."""
    request_millis: tuple[int, ...]
    source: str
    """``sized`` (that run's size resizes), ``duty`` (its duty cycles x headroom) or
    ``running`` (a copy of the same submission running now, already sized)."""
    duty: tuple[float, ...] = ()
    """That run's per-rank steady-state duty cycles (empty if any is missing)."""

    def describe(self) -> str:
        how = {
            "sized": "its duty-cycle sizing",
            "duty": "its duty cycles x headroom",
            "running": "a copy running now, sized from its duty cycles",
        }[self.source]
        return f"requests {list(self.request_millis)}m learned from run {self.run_id} ({how})"


def learnable(sub: Submission) -> bool:
    return sub.sizing == "duty" and not sub.phases and sub.qos == QoS.REQUESTS.value


START_KINDS = ("learned", "profiled", "plan")
"""How a run starts (recorded as ``start`` in its options, `start_of`)."""


def start_of(sub: Submission, found: LearnedSizes | None) -> str:
    """How a run of ``sub`` starts: ``learned`` (at the sizes ``found``, counted as sized
    from its launch: no warm-up and profiling window), ``profiled`` (at its plan, then
    profiled and sized live) or ``plan`` (its plan's requests throughout: fixed sizing or
    a phase schedule). Single-run baselines are kept apart by it
    (`rankpack.controller.baselines`)."""
    if found is not None:
        return "learned"
    return "profiled" if sub.sizing == "duty" and not sub.phases else "plan"


def ran_alone(run: RunRow) -> bool:
    """Its measurements are what it does alone: no other simulation of its controller ran
    beside it (``shared_s`` 0), or it is a single run from before runs recorded that."""
    if run.shared_s is None:
        return "multiplex_id" not in run.options
    return run.shared_s == 0


def matches(run: RunRow, sub: Submission, backend: str) -> bool:
    """Same case, decomposition, ranks and backend; completed, and it ran alone."""
    if not (
        run.status == "completed"
        and ran_alone(run)
        and run.case_name == Path(sub.case).name
        and run.n_ranks == sub.n_ranks
        and run.decompose == sub.decompose
        and run.backend == backend
    ):
        return False
    if sub.decompose == "equal":
        return True
    o = run.options
    weights = tuple(float(w) for w in (o.get("decompose_weights") or o.get("weights") or ()))
    center = o.get("center")
    return weights == (sub.decompose_weights or sub.weights) and (
        (tuple(center) if center else None) == sub.center
    )


def learned_sizes(
    store: Store,
    sub: Submission,
    backend: str,
    *,
    headroom: float,
    floor_millis: int,
    runs: Sequence[RunRow] | None = None,
) -> LearnedSizes | None:
    """The learned per-rank requests of ``sub``, or None (nothing learnable recorded)."""
    if not learnable(sub):
        return None
    candidates = runs if runs is not None else store.all_runs()
    floor = max(floor_millis, sub.floor_millis)
    for row in sorted(candidates, key=lambda r: r.id, reverse=True):
        if not matches(row, sub, backend):
            continue
        run = store.get_run(row.id)
        found = _from_resizes(run) or _from_duty(run, headroom, floor)
        if found is None:
            continue
        wanted, source = found
        wanted = [max(floor, w) for w in wanted]
        if sum(wanted) > sub.budget_millis:
            if floor * len(wanted) > sub.budget_millis:
                continue
            wanted = proportional_millis([float(w) for w in wanted], sub.budget_millis, floor)
        duties = tuple(float(r.duty) for r in sorted(run.ranks, key=lambda k: k.rank)
                       if r.duty is not None)  # fmt: skip
        return LearnedSizes(
            run.id, tuple(wanted), source, duties if len(duties) == run.n_ranks else ()
        )
    return None


def _from_resizes(run: RunRow) -> tuple[list[int], str] | None:
    last: dict[int, int] = {}
    for r in run.resizes:
        if r.kind == "size" and r.status == "completed":
            last[r.rank] = r.to_millis
    if len(last) != run.n_ranks or set(last) != set(range(run.n_ranks)):
        return None
    return [last[i] for i in range(run.n_ranks)], "sized"


def _from_duty(run: RunRow, headroom: float, floor: int) -> tuple[list[int], str] | None:
    wall = run.wall_s or 0.0
    if wall <= 0 or len(run.ranks) != run.n_ranks or any(r.duty is None for r in run.ranks):
        return None
    mode = str(run.options.get("wait_mode", "spin"))
    out = []
    for r in sorted(run.ranks, key=lambda k: k.rank):
        cores = rank_compute_cores(min(1.0, max(0.0, r.duty or 0.0)), (r.cpu_s or 0.0) / wall, mode)
        out.append(max(floor, math.ceil(cores * 1000 * headroom - 1e-6)))
    return out, "duty"
