"""What the controller tests share: snapshots, observations and action filters for the
policy tests; `Recorded`, the queue of one that remembers what the loop told it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    Decision,
    NodeCores,
    Observations,
    QueuedSim,
    RankSnapshot,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.jobs import Job, OneJob
from rankpack.controller.tracked import LoopSettings
from rankpack.core.actions import Action, Note, Resize, StageJob, WaitSetting
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import RunResult
from rankpack.plan.submission import Phase, Submission

S = ControllerSettings()
GIGA = 1_000_000_000


def snap(
    sim_id: str = "a",
    requests: Sequence[int] = (1000, 1000),
    *,
    iterations: int = 50,
    expected: int = 100,
    budget: int = 8000,
    usage_ns: Sequence[int] | None = None,
    compute_ns: Sequence[int | None] | None = None,
    mpi_ns: Sequence[int | None] | None = None,
    phases: tuple[Phase, ...] = (),
    wait: WaitSetting = "polite",
) -> SimSnapshot:
    """A simulation snapshot; shim counters default to 0 (present), usage to 0; its ranks
    wait politely (what co-located simulations do) unless ``wait`` says otherwise."""
    n = len(requests)
    usage = list(usage_ns) if usage_ns is not None else [0] * n
    comp = list(compute_ns) if compute_ns is not None else [0] * n
    mpi = list(mpi_ns) if mpi_ns is not None else [0] * n
    ranks = tuple(
        RankSnapshot(
            rank=i,
            request_millis=requests[i],
            usage_ns=usage[i],
            compute_ns=comp[i],
            mpi_ns=mpi[i],
        )
        for i in range(n)
    )
    return SimSnapshot(
        sim_id=sim_id,
        started_s=0.0,
        iterations=iterations,
        expected_iterations=expected,
        budget_millis=budget,
        ranks=ranks,
        phases=phases,
        wait=wait,
    )


def observe(
    now_s: float,
    *sims: SimSnapshot,
    queue: Sequence[QueuedSim] = (),
    capacity: int = 8000,
    others: int = 0,
    nodes: tuple[NodeCores, ...] | None = None,
) -> Observations:
    """What the loop observed at ``now_s``; given ``nodes``, the capacity is theirs."""
    if nodes is not None:
        capacity = sum(n.allocatable_millis for n in nodes)
    return Observations(now_s=now_s, capacity_millis=capacity, sims=sims, queue=tuple(queue),
                        others_millis=others, nodes=nodes or ())  # fmt: skip


def queued(qid: int, ranks: int = 8, millis: int = 1000) -> QueuedSim:
    return QueuedSim(queue_id=qid, n_ranks=ranks, initial_request_millis=(millis,) * ranks)


def running_on(
    sim_id: str, node: str, ranks: int = 8, millis: int = 1000, started_s: float = 0.0
) -> SimSnapshot:
    """A simulation whose ``ranks`` ranks all run on ``node``."""
    return SimSnapshot(
        sim_id=sim_id,
        started_s=started_s,
        iterations=50,
        expected_iterations=100,
        budget_millis=ranks * 1000,
        ranks=tuple(RankSnapshot(i, millis, 0, 0, 0, node=node) for i in range(ranks)),
        wait="polite",
    )


def resizes(d: Decision) -> list[Resize]:
    return [a for a in d.actions if isinstance(a, Resize)]


def notes(d: Decision, kind: str | None = None) -> list[Note]:
    return [a for a in d.actions if isinstance(a, Note) and (kind is None or a.kind == kind)]


def launches(d: Decision) -> list[StageJob]:
    return [a for a in d.actions if isinstance(a, StageJob)]


def apply(sims: Sequence[SimSnapshot], actions: Sequence[Action]) -> list[SimSnapshot]:
    """The snapshots with the Resizes applied (what the driver would observe next)."""
    out = []
    for sim in sims:
        ranks = list(sim.ranks)
        for a in actions:
            if isinstance(a, Resize) and a.sim_id == sim.sim_id:
                ranks = [
                    replace(r, request_millis=a.request_millis) if r.rank == a.rank else r
                    for r in ranks
                ]
        out.append(replace(sim, ranks=tuple(ranks)))
    return out


def state_of(**mems: SimMemory) -> ControllerState:
    return ControllerState(sims=dict(mems))


SIZED = SimMemory(stage="sized", duty=(0.1, 0.1))


class Recorded(OneJob):
    """`rankpack run`'s queue of one, remembering what the loop told it: each requeue (the
    job, why) and each end (status, message, failure code)."""

    def __init__(self, submission: Submission) -> None:
        super().__init__(submission)
        self.requeues: list[tuple[Job, Failure]] = []
        self.ends: list[tuple[str, str, FailureCode | None]] = []

    def requeued(self, job: Job, why: Failure) -> None:
        self.requeues.append((job, why))
        super().requeued(job, why)

    def finished(
        self,
        job: Job,
        status: str,
        message: str = "",
        failure: FailureCode | None = None,
        result: RunResult | None = None,
    ) -> None:
        self.ends.append((status, message, failure))

    @property
    def statuses(self) -> list[str]:
        """The status of each end, in order."""
        return [status for status, _, _ in self.ends]

    @property
    def whys(self) -> list[Failure]:
        """Why it was requeued, each time."""
        return [why for _, why in self.requeues]


def quick_loop_settings(tmp_path: Path) -> LoopSettings:
    """The loop's settings with no cooldown between launches, its runs under ``tmp_path``."""
    return LoopSettings(runs_root=tmp_path / "runs",
                        controller=ControllerSettings(launch_cooldown_s=0.0))  # fmt: skip
