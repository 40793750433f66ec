"""Adoption at the start of a term (`adoption`): a run that ended under this process whose
end was not written yet is written with its result, read from the store, and not adopted;
a Simulation claimed and never launched goes back to the queue. Against `FakeSims`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rankpack.core.results import ResizeRecord, RunResult
from rankpack.operator import adoption, queue
from rankpack.store import NewRun, RankRow, Store
from tests.fakeapi import FakeSims

STAGED = {"runDir": "/runs/r", "caseName": "pitzDaily", "caseSource": "tutorial",
          "solver": "simpleFoam", "cellsPerRank": [1, 1], "expectedIterations": 10}  # fmt: skip


class NoLoop:
    def adopt(self, adopted: Any) -> None:
        raise AssertionError(f"{adopted.sim_id} ended: it is not adopted")


class NoOrphans:
    def list(self) -> list[Any]:
        return []


def _ended_run(store: Store) -> int:
    run_id = store.create_run(
        NewRun(
            case_name="pitzDaily", case_source="tutorial", run_dir="/runs/r",
            solver="simpleFoam", n_ranks=2, qos="requests", total_millis=2000,
            decompose="equal", backend="kubernetes", placement={}, expected_iterations=10,
            options={},
        ),
        [RankRow(0, 1.0, 1000, None, 1), RankRow(1, 1.0, 1000, None, 1)],
    )  # fmt: skip
    store.add_resize(run_id, ResizeRecord(0, 1.0, 1000, 600, "completed", 0.2))
    store.finish_run(RunResult(
        id=run_id, status="completed", case="pitzDaily", solver="simpleFoam",
        run_dir="/runs/r", n_ranks=2, qos="requests", total_millis=2000, iterations=10,
        expected_iterations=10, wall_s=3.0, cpu_s=4.0, exit_code=0, message=None, ranks=(),
    ))  # fmt: skip
    return run_id


def test_a_run_that_ended_unwritten_is_written_with_its_result(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    run_id = _ended_run(store)
    sims = FakeSims()
    sims.add("a", {"phase": "Running", "simId": "s1", "runId": run_id, "staged": STAGED})
    q = queue.SimulationQueue(sims, "op-1")  # type: ignore[arg-type]
    took = adoption.Adoption(q, store, NoOrphans(), lambda s: None)  # type: ignore[arg-type]
    assert took.adopt_all(NoLoop(), threading.Event()) == 0  # type: ignore[arg-type]
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Succeeded"
    assert (st["result"]["iterations"], st["result"]["wallSeconds"], st["resizes"]) == (10, 3.0, 1)


def test_a_claim_never_launched_goes_back_to_the_queue(tmp_path: Path) -> None:
    sims = FakeSims()
    sims.add("a", {"phase": "Running", "operator": "op-0"})
    q = queue.SimulationQueue(sims, "op-1")  # type: ignore[arg-type]
    took = adoption.Adoption(q, Store(tmp_path / "db.sqlite"), NoOrphans(), print)  # type: ignore[arg-type]
    assert took.requeue_unlaunched(threading.Event()) == 1
    assert sims.objs["a"]["status"]["phase"] == "Queued"
