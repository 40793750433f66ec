"""A run a lost node cut short is requeued to resume, never failed (issue 28, item 4).

The backend ends a simulation with the code ``NodeLost``; the loop records that run as
``requeued`` (code ``NodeLost``), hands the job back to its source with what to resume from
(`Resume`: its staged case, the iterations done at the loss) and launches it again; the
stage of the relaunch asks the backend to resume that case (`StageSpec.resume`), whose
staged case says from which write it starts (`StagedCase.start_iterations`); the run that
resumes records the iterations lost. On the simulated backend (virtual time): it is told
which simulation a node loss ends, and stages a resume as the real backends do (the case
kept, its start moved to its last write).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rankpack.backend.protocol import SimObservation, SimPhase, StageSpec
from rankpack.controller.jobs import Resume, StoreQueue
from rankpack.controller.loop import run_jobs
from rankpack.controller.requeue import resumed_facts
from rankpack.core.failures import FailureCode
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

from ._helpers import Recorded, quick_loop_settings

CASE = SimulatedCase("box", cells=8000, iterations=40, cell_work_s=1e-4)
SUB = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")
KEPT = 20
"""The last write the lost run left (its case resumes from it)."""


class LosesANode(SimulatedBackend):
    """The first simulation launched loses a node once it has run ``at`` iterations (a
    NodeLost failure, as the Kubernetes backend reports it); a resume is staged as the
    real backends stage it: its case kept, started again from write ``KEPT``."""

    def __init__(self, at: int = 27) -> None:
        super().__init__(SimulatedCluster(nodes=(SimNode("n", 4000),), cases=(CASE,)))
        self.at = at
        self.stages: list[StageSpec] = []
        self.first: str | None = None
        self.lost = False
        self.done: dict[str, int] = {}
        """Iterations each simulation's log has shown."""

    def stage(self, spec: StageSpec) -> None:
        self.stages.append(spec)
        super().stage(spec)

    def observe(self, sim_id: str) -> SimObservation:
        obs = super().observe(sim_id)
        spec = next(s for s in self.stages if s.sim_id == sim_id)
        if obs.staged is not None and spec.resume is not None:
            staged = replace(obs.staged, run_dir=spec.resume.run_dir, resumed_from=str(KEPT),
                             start_iterations=KEPT)  # fmt: skip
            return replace(obs, staged=staged)
        if obs.phase is SimPhase.RUNNING and self.first is None:
            self.first = sim_id
        done = self.done[sim_id] = self.done.get(sim_id, 0) + obs.log_text.count("ExecutionTime")
        if sim_id == self.first and not self.lost and done >= self.at:
            self.lost = True
            self.stop(sim_id)
        if sim_id == self.first and self.lost:  # (every observation after it says so)
            why = "rank pod s-0 is on a lost node: node n: the control plane no longer hears"
            return replace(obs, phase=SimPhase.FAILED, failure=FailureCode.NODE_LOST, reason=why)
        return obs


def test_node_lost_is_requeued_and_resumed_not_failed(tmp_path: Path) -> None:
    backend, jobs = LosesANode(), Recorded(SUB)
    store = Store(tmp_path / "r.db")
    result = run_jobs(backend, store, jobs, quick_loop_settings(tmp_path))
    assert [r.status for r in result.results] == ["completed"]
    assert jobs.statuses == ["completed"]  # ended once, never failed
    ((job, why),) = jobs.requeues
    assert why.code is FailureCode.NODE_LOST and "lost node" in why.message
    resume = job.resume
    assert resume is not None and resume.losses == 1
    assert resume.iterations_at_loss >= 27
    # the relaunch resumed the same case instead of staging a new copy
    first, again = backend.stages
    assert first.resume is None and again.resume is not None
    assert again.resume.run_dir == resume.staged.run_dir
    runs = sorted(store.list_runs(10), key=lambda r: r.id)
    assert [r.status for r in runs] == ["requeued", "completed"]
    assert runs[0].failure == "NodeLost" and "to resume" in (runs[0].message or "")
    assert runs[0].run_dir == runs[1].run_dir
    # the resumed run says from where and what was lost (its run options: the run JSON)
    opts = runs[1].options
    assert opts["resumed_from"] == str(KEPT) and opts["start_iterations"] == KEPT
    assert opts["iterations_lost"] == resume.iterations_at_loss - KEPT
    assert opts["lost_run_id"] == runs[0].id and opts["node_losses"] == 1
    lost = [e for e in store.events() if e.kind == "node-lost"]
    resumed = [e for e in store.events() if e.kind == "resumed"]
    assert len(lost) == 1 and lost[0].detail["code"] == "NodeLost"
    assert len(resumed) == 1 and resumed[0].detail["iterations_lost"] == opts["iterations_lost"]
    assert not [e for e in store.events() if e.kind == "launch-requeued"]  # no back-off


def test_other_failures_are_not_requeued(tmp_path: Path) -> None:
    class Fails(LosesANode):
        def observe(self, sim_id: str) -> SimObservation:
            obs = super().observe(sim_id)
            if obs.failure is FailureCode.NODE_LOST:
                return replace(obs, failure=FailureCode.RANK_FAILED)
            return obs

    jobs = Recorded(SUB)
    result = run_jobs(Fails(), Store(tmp_path / "r.db"), jobs, quick_loop_settings(tmp_path))
    assert [r.status for r in result.results] == ["failed"] and jobs.statuses == ["failed"]
    assert not jobs.requeues


def test_the_store_queue_keeps_what_to_resume_from(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    (qid,) = store.submit_many("box", 2, SUB.to_json(), 1)
    backend = LosesANode()
    result = run_jobs(backend, store, StoreQueue(store, None), quick_loop_settings(tmp_path))
    assert [r.status for r in result.results] == ["completed"]
    assert backend.stages[1].resume is not None
    row = store.get_queue(qid)
    assert row is not None and row.status == "completed"


def test_iterations_lost_are_those_after_the_write_resumed_from() -> None:
    from rankpack.case.staging import StagedCase

    case = StagedCase(Path("/r"), "box", "box", "simpleFoam", (4000, 4000), 300)
    resume = Resume(case, iterations_at_loss=137, lost_run_id=4, losses=2, iterations_lost=9)
    at_130 = replace(case, resumed_from="130", start_iterations=130)
    facts = resumed_facts(resume, at_130)
    assert facts["iterations_lost"] == 7 and facts["iterations_lost_total"] == 16
    assert facts["resumed_from"] == "130" and facts["node_losses"] == 2
    # nothing written: from the start, everything done is lost
    assert resume.lost_now(case) == 137
    assert resumed_facts(resume, case)["resumed_from"] == "start"
    # a write past the last observation (observations lag behind the solver: seen on the
    # dev cluster, 104 observed and 120 written): it was done, nothing after it is known
    at_140 = replace(case, resumed_from="140", start_iterations=140)
    assert resume.lost_now(at_140) == 0
    late = resumed_facts(resume, at_140)
    assert late["iterations_at_loss"] == 140 and late["iterations_lost"] == 0
    assert resume.done_at_loss(at_130) == 137


class NoNodeFirst(SimulatedBackend):
    """The first launch's pods find no node (the backend says ``Unschedulable``, as the
    Kubernetes backend does once the scheduler has said so for a while); later ones run."""

    def __init__(self) -> None:
        super().__init__(SimulatedCluster(nodes=(SimNode("n", 4000),), cases=(CASE,)))
        self.first: str | None = None

    def observe(self, sim_id: str) -> SimObservation:
        obs = super().observe(sim_id)
        if self.first is None and obs.phase in (SimPhase.PENDING, SimPhase.RUNNING):
            self.first = sim_id
        if sim_id == self.first:
            why = "pod s-g0 cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu."
            return replace(obs, phase=SimPhase.FAILED, failure=FailureCode.UNSCHEDULABLE,
                           reason=why)  # fmt: skip
        return obs


def test_a_launch_no_node_takes_is_rolled_back_into_the_queue_not_failed(tmp_path: Path) -> None:
    """Issue 40: ``Unschedulable`` is the scheduler's answer, not the run's: the run is
    recorded ``requeued`` with the scheduler's reason and the job launched again after a
    back-off (``launch-requeued``), once."""
    backend, jobs = NoNodeFirst(), Recorded(SUB)
    store = Store(tmp_path / "r.db")
    result = run_jobs(backend, store, jobs, quick_loop_settings(tmp_path))
    assert [r.status for r in result.results] == ["completed"]
    assert jobs.statuses == ["completed"]  # ended once, never failed
    ((_, why),) = jobs.requeues
    assert why.code is FailureCode.UNSCHEDULABLE and "Insufficient cpu" in why.message
    assert "rolled back" in why.message
    runs = sorted(store.list_runs(10), key=lambda r: r.id)
    assert [r.status for r in runs] == ["requeued", "completed"]
    assert runs[0].failure == "Unschedulable"
    (again,) = [e for e in store.events() if e.kind == "launch-requeued"]
    assert again.detail["code"] == "Unschedulable" and again.detail["delay_s"] > 0
