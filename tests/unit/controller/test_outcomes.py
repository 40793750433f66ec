"""A run's result from what the loop recorded: live numbers where it watched the ranks, the
shim's final records where it did not (a run adopted after it had ended)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from rankpack.backend.protocol import (
    Backend,
    RankObservation,
    RankPhase,
    RankResources,
    SimObservation,
    SimPhase,
    StagedCase,
)
from rankpack.controller.jobs import Job, JobSource
from rankpack.controller.outcomes import Ending, run_result
from rankpack.controller.recording import Recorder
from rankpack.controller.resizes import Resizes
from rankpack.controller.tracked import LoopContext, LoopSettings, Tracked
from rankpack.plan.submission import Submission
from rankpack.profile.finals import FinalRecord
from rankpack.store import Store

GIGA = 1_000_000_000


class _Clock:
    """What `run_result` asks of a backend: its name, its clock and its placement facts."""

    name = "fake"

    def clock(self) -> float:
        return 100.0

    def placement(self) -> dict[str, str]:
        return {}


def _final(rank: int, compute_s: float, mpi_s: float, cpu_s: float) -> FinalRecord:
    return FinalRecord(rank=rank, compute_s=compute_s, mpi_s=mpi_s, cpu_s=cpu_s,
                       wall_s=compute_s + mpi_s, finalized=True, wait_mode="spin",
                       wait_switches=0)  # fmt: skip


def _rank(rank: int, usage_s: float, **kw: Any) -> RankObservation:
    return RankObservation(rank, RankPhase.SUCCEEDED, RankResources(1000), None,
                           int(usage_s * GIGA), **kw)  # fmt: skip


def _loop(tmp_path: Path) -> tuple[LoopContext, Recorder, Tracked]:
    ctx = LoopContext(
        backend=cast(Backend, _Clock()), store=cast(Store, None), jobs=cast(JobSource, None),
        settings=LoopSettings(runs_root=tmp_path), t0=0.0,
    )  # fmt: skip
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=2000)
    sim = Tracked(job=Job(0, sub), sim_id="s1", plan=sub.plan(), queued_s=0.0,
                  wait_setting="spin")  # fmt: skip
    sim.staged = StagedCase(tmp_path, "box", "tutorial", "simpleFoam", (10, 10), 100)
    sim.run_id = 1
    sim.usages = [[], []]
    return ctx, Recorder(ctx, Resizes(ctx)), sim


def test_a_run_adopted_after_its_end_takes_duty_and_cpu_from_the_final_records(
    tmp_path: Path,
) -> None:
    """Its first observation is its end: its pods are gone (usage 0), no shim sample, one
    usage sample per rank. Rank 1 wrote no final record: it has neither."""
    ctx, recorder, sim = _loop(tmp_path)
    ranks = (_rank(0, 0.0, final=_final(0, 6.0, 2.0, 7.5)), _rank(1, 0.0))
    recorder.record(sim, SimObservation("s1", 40.0, SimPhase.SUCCEEDED, ranks, exit_code=0))
    result = run_result(ctx, sim, Ending())
    first, second = result.ranks
    assert (first.duty, first.cpu_s) == (0.75, 7.5)
    assert (second.duty, second.cpu_s) == (None, 0.0)
    assert result.cpu_s == 7.5


def test_samples_of_ended_pods_do_not_hide_the_final_records(tmp_path: Path) -> None:
    """Adopted after its end while its pods still stood: several samples of flat counters
    (nothing to integrate), no duty mark: the final records' duty and CPU."""
    ctx, recorder, sim = _loop(tmp_path)
    for t in (40.0, 41.0, 42.0):
        ranks = tuple(_rank(i, 30.0, final=_final(i, 6.0, 2.0, 7.5)) for i in range(2))
        recorder.record(sim, SimObservation("s1", t, SimPhase.RUNNING, ranks))
    recorder.record(sim, SimObservation("s1", 43.0, SimPhase.SUCCEEDED, ranks, exit_code=0))
    result = run_result(ctx, sim, Ending())
    assert [(r.duty, r.cpu_s) for r in result.ranks] == [(0.75, 7.5), (0.75, 7.5)]


def test_a_watched_run_keeps_its_live_numbers_beside_the_final_records(tmp_path: Path) -> None:
    """Launched here (a sample of 0 at launch), observed running and at its end: the live
    CPU integral and duty marks win over final records that say otherwise."""
    ctx, recorder, sim = _loop(tmp_path)
    sim.times.append(0.0)
    for series in sim.usages:
        series.append(0)
    running = tuple(_rank(i, 10.0, compute_ns=5 * GIGA, mpi_ns=5 * GIGA) for i in range(2))
    recorder.record(sim, SimObservation("s1", 10.0, SimPhase.RUNNING, running))
    ended = tuple(
        _rank(i, 20.0, compute_ns=8 * GIGA, mpi_ns=12 * GIGA, final=_final(i, 1.0, 9.0, 2.0))
        for i in range(2)
    )
    recorder.record(sim, SimObservation("s1", 20.0, SimPhase.SUCCEEDED, ended, exit_code=0))
    result = run_result(ctx, sim, Ending())
    for rank in result.ranks:
        assert rank.cpu_s == pytest.approx(20.0)
        # between the two marks (3 s computing, 7 s in MPI), not the final record's 0.1
        assert rank.duty == pytest.approx(0.3)
