"""Learned sizes: a case profiled before starts at the requests its earlier run was sized
to, so copies fit at once (simulated backend, a real SQLite store in a temporary dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.controller import loop
from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    Decision,
    Observations,
)
from rankpack.controller.jobs import OneJob, StoreQueue
from rankpack.controller.learned import learned_sizes
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

# rank 1 (6000 cells) computes 0.6 s per iteration, rank 0 0.2 s; 0.4 s of MPI each:
# duties 0.2 and 0.6 on a core each -> sized to 250m and 750m (headroom 1.25)
CASE = SimulatedCase("box", cells=8000, iterations=60, cell_work_s=1e-4, mpi_s_per_iteration=0.4)
SUB = Submission(case="box", weights=(1.0, 1.0), budget_millis=2000, sizing="duty",
                 decompose="weighted", decompose_weights=(1.0, 3.0))  # fmt: skip


def _one_node_backend() -> SimulatedBackend:
    return SimulatedBackend(SimulatedCluster(nodes=(SimNode("node-a", 2000),), cases=(CASE,)))


def _learning_settings(tmp_path: Path, n: int) -> LoopSettings:
    controller = ControllerSettings(max_concurrent=n, profile_s=3.0, launch_cooldown_s=0.0,
                                    min_predicted_gain=-1.0)  # fmt: skip
    return LoopSettings(runs_root=tmp_path / "runs", controller=controller)


def _profiled_run(tmp_path: Path, store: Store, backend: SimulatedBackend) -> int:
    result = run_jobs(backend, store, OneJob(SUB), _learning_settings(tmp_path, 1))
    (run,) = result.results
    assert run.status == "completed"
    sized = {r.rank: r.to_millis for r in run.resizes if r.kind == "size"}
    assert sized == {0: 250, 1: 750}
    return run.id


def test_nothing_recorded_nothing_learned(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    assert learned_sizes(store, SUB, "simulated", headroom=1.25, floor_millis=50) is None


def test_learned_from_the_sized_run_only_for_the_same_case_decomposition_and_ranks(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "r.db")
    run_id = _profiled_run(tmp_path, store, _one_node_backend())

    def learn(sub: Submission, backend: str = "simulated") -> object:
        return learned_sizes(store, sub, backend, headroom=1.25, floor_millis=50)

    found = learn(SUB)
    assert found is not None
    assert (found.run_id, found.request_millis, found.source) == (run_id, (250, 750), "sized")  # type: ignore[attr-defined]
    from dataclasses import replace

    assert learn(replace(SUB, decompose="equal", decompose_weights=())) is None
    assert learn(replace(SUB, decompose_weights=(1.0, 2.0))) is None
    assert learn(replace(SUB, weights=(1.0, 1.0, 1.0))) is None
    assert learn(replace(SUB, case="other")) is None
    assert learn(SUB, backend="local") is None
    assert learn(replace(SUB, sizing="fixed")) is None
    # a smaller budget caps the learned requests (in proportion)
    capped = learn(replace(SUB, budget_millis=500))
    assert capped is not None and sum(capped.request_millis) == 500  # type: ignore[attr-defined]


def test_copies_start_at_learned_sizes_and_run_together_at_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    backend = _one_node_backend()
    run_id = _profiled_run(tmp_path, store, backend)
    store.submit_many("box", 2, SUB.to_json(), 2)
    result = run_jobs(backend, store, StoreQueue(store, None), _learning_settings(tmp_path, 2))
    assert [r.status for r in result.results] == ["completed", "completed"]
    assert result.max_concurrent_seen == 2
    learned = [e for e in store.events() if e.kind == "learned-sizes"]
    assert len(learned) == 2
    assert all(e.detail["from_run"] == run_id for e in learned)
    assert f"learned from run {run_id}" in learned[0].detail["reason"]
    launches = [e for e in store.events() if e.kind == "launch" and e.run_id != run_id]
    assert [e.detail["request_millis"] for e in launches] == [[250, 750], [250, 750]]
    # both were launched before either was profiled again: no new profiling window
    kinds = [e.kind for e in store.events() if e.run_id != run_id]
    assert "profile-start" not in kinds
    first, second = sorted(result.outcomes, key=lambda o: o.started_s)
    assert second.started_s < first.finished_s
    assert second.started_s - first.started_s < 5.0  # not after a profiling window


def test_a_copy_starts_at_the_sizes_of_a_running_copy(tmp_path: Path) -> None:
    """Nothing recorded: the first copy launches at its plan (1000m per rank, the whole
    node), is profiled and sized; the second then starts at those sizes (``running``) and
    fits beside it, instead of waiting for the first to end."""
    store = Store(tmp_path / "r.db")
    store.submit_many("box", 2, SUB.to_json(), 2)
    result = run_jobs(
        _one_node_backend(), store, StoreQueue(store, None), _learning_settings(tmp_path, 2)
    )
    assert [r.status for r in result.results] == ["completed", "completed"]
    assert result.max_concurrent_seen == 2
    first, second = sorted(result.outcomes, key=lambda o: o.started_s)
    assert second.started_s < first.finished_s  # together, not one after the other
    (learned,) = [e for e in store.events() if e.kind == "learned-sizes"]
    assert learned.detail["source"] == "running"
    assert learned.detail["from_run"] == first.id
    assert learned.detail["request_millis"] == [250, 750]
    launches = [e.detail["request_millis"] for e in store.events() if e.kind == "launch"]
    assert launches == [[1000, 1000], [250, 750]]


def test_runs_that_shared_the_node_teach_no_sizes(tmp_path: Path) -> None:
    """Copies that ran together record the time they shared the node; the next copy learns
    from the run that had the node to itself, not from the newest (shared) ones, whose
    duty cycles measured their sharing. A copy run alone afterwards teaches again."""
    store = Store(tmp_path / "r.db")
    backend = _one_node_backend()
    alone = _profiled_run(tmp_path, store, backend)
    store.submit_many("box", 2, SUB.to_json(), 2)
    together = run_jobs(backend, store, StoreQueue(store, None), _learning_settings(tmp_path, 2))
    assert together.max_concurrent_seen == 2
    assert store.get_run(alone).shared_s == 0
    shared = [store.get_run(r.id).shared_s for r in together.results]
    assert all(s is not None and s > 0 for s in shared), shared
    found = learned_sizes(store, SUB, "simulated", headroom=1.25, floor_millis=50)
    assert found is not None and found.run_id == alone
    (later,) = run_jobs(backend, store, OneJob(SUB), _learning_settings(tmp_path, 1)).results
    assert store.get_run(later.id).shared_s == 0
    found = learned_sizes(store, SUB, "simulated", headroom=1.25, floor_millis=50)
    assert found is not None and found.run_id == later.id


def test_the_dry_run_sees_the_learned_sizes_and_applies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "r.db")
    backend = _one_node_backend()
    run_id = _profiled_run(tmp_path, store, backend)
    store.submit_many("box", 2, SUB.to_json(), 1)
    seen: list[Observations] = []
    real = loop.decide

    def spy(obs: Observations, state: ControllerState, settings: ControllerSettings) -> Decision:
        seen.append(obs)
        return real(obs, state, settings)

    monkeypatch.setattr(loop, "decide", spy)
    events = len(store.events())
    decision = loop.preview(
        backend, store, StoreQueue(store, None), _learning_settings(tmp_path, 2)
    )
    (obs,) = seen
    assert obs.queue[0].initial_request_millis == (250, 750)  # as the run would see it
    assert len(obs.queue[0].duty) == 2
    assert [type(a).__name__ for a in decision.actions] == ["StageJob"]
    assert len(store.events()) == events and len(store.queue()) == 1 and backend.list() == ()
    assert run_id in {r.id for r in store.all_runs()}
