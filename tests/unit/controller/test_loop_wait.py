"""The loop carries out the policy's wait-mode switches through the backend (simulated,
virtual time): launched in spin under ``auto``, polite while sharing, spin again alone."""

from __future__ import annotations

from pathlib import Path

from rankpack.backend.protocol import BackendError, ShimSpec, SimSpec
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import OneJob, StoreQueue
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=100, cell_work_s=1e-4)


def _wait_cluster(cores: int = 4) -> SimulatedCluster:
    return SimulatedCluster(nodes=(SimNode("node-a", cores * 1000),), cases=(CASE,))


def _wait_sub(iterations: int | None = None) -> Submission:
    return Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed",
                      iterations=iterations)  # fmt: skip


class Recording(SimulatedBackend):
    """The simulated backend, remembering the launch specs and refusing the first
    ``refuse`` wait-mode switches (as a backend does while a record is not published)."""

    def __init__(self, cluster: SimulatedCluster, refuse: int = 0) -> None:
        super().__init__(cluster)
        self.specs: list[SimSpec] = []
        self.refuse = refuse
        self.calls: list[tuple[str, str]] = []

    def launch(self, spec: SimSpec) -> None:
        self.specs.append(spec)
        super().launch(spec)

    def set_wait_mode(self, sim_id: str, mode: str) -> None:
        self.calls.append((sim_id, mode))
        if self.refuse > 0:
            self.refuse -= 1
            raise BackendError("rank 1's live record is not published yet")
        super().set_wait_mode(sim_id, mode)


def _two(tmp_path: Path, backend: SimulatedBackend, wait: str = "auto") -> Store:
    store = Store(tmp_path / "r.db")
    store.submit_many("box", 2, _wait_sub().to_json(), 1)
    store.submit_many("box", 2, _wait_sub(iterations=40).to_json(), 1)
    settings = LoopSettings(
        runs_root=tmp_path / "runs", wait_mode=wait,
        controller=ControllerSettings(max_concurrent=2, launch_cooldown_s=0.0,
                                      min_predicted_gain=-1.0),
    )  # fmt: skip
    result = run_jobs(backend, store, StoreQueue(store, None), settings)
    assert [r.status for r in result.results] == ["completed", "completed"]
    assert result.max_concurrent_seen == 2
    return store


def _wait_events(store: Store) -> list[tuple[int | None, str]]:
    return [(e.run_id, e.detail["mode"]) for e in store.events() if e.kind == "wait-mode"]


def test_auto_switches_to_polite_while_ranks_outnumber_cores_and_back_to_spin(
    tmp_path: Path,
) -> None:
    # two 2-rank simulations on 3 cores: 4 ranks share them while both run
    backend = Recording(_wait_cluster(cores=3))
    store = _two(tmp_path, backend)
    # the second is launched beside the first: 4 ranks on 3 cores, polite from its start
    assert [s.shim.wait_mode for s in backend.specs if s.shim] == ["spin", "polite"]
    # the MPI library's own idle yield matches the launch mode
    assert [s.env["OMPI_MCA_mpi_yield_when_idle"] for s in backend.specs] == ["0", "1"]
    first, _second = (r.id for r in sorted(store.list_runs(10), key=lambda r: r.id))
    # the first goes polite when the second is launched; the second (40 iterations) ends
    # first and the first spins again
    assert _wait_events(store) == [(first, "polite"), (first, "spin")]
    events = [e for e in store.events() if e.kind == "wait-mode"]
    assert (
        "ranks outnumber cores: 4 ranks on the 3 cores of node node-a" in events[0].detail["reason"]
    )
    assert "every rank has a core to itself: 2 ranks on the 3 cores" in events[-1].detail["reason"]
    # the switch reached the ranks: the first's ranks are observed spinning at the end
    kinds = [e.kind for e in store.events()]
    assert kinds.index("wait-mode") > kinds.index("stage")


def test_two_simulations_whose_ranks_each_have_a_core_keep_spinning(tmp_path: Path) -> None:
    backend = Recording(_wait_cluster(cores=4))  # 2 x 2 ranks on 4 cores
    store = _two(tmp_path, backend)
    assert [s.shim.wait_mode for s in backend.specs if s.shim] == ["spin", "spin"]
    assert backend.calls == [] and _wait_events(store) == []


def test_one_simulation_with_more_ranks_than_cores_waits_politely_in_the_loop(
    tmp_path: Path,
) -> None:
    # issue 24: 4 ranks of one simulation on 2 cores spin against each other
    backend = Recording(_wait_cluster(cores=2))
    store = Store(tmp_path / "r.db")
    sub = Submission(case="box", weights=(1.0, 1.0, 5.0, 15.0), budget_millis=2000)
    settings = LoopSettings(runs_root=tmp_path / "runs", wait_mode="auto",
                            controller=ControllerSettings(max_concurrent=1))  # fmt: skip
    result = run_jobs(backend, store, OneJob(sub), settings).results[0]
    assert result.status == "completed"
    assert backend.specs[0].shim == ShimSpec("polite", "openmpi")
    assert backend.specs[0].env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert backend.specs[0].env["MPIR_CVAR_POLLS_BEFORE_YIELD"] == "1000"
    # the run says which mode each rank got and why; the rule never switched it
    (launch,) = result.wait_modes
    assert launch.mode == "polite" and "ranks outnumber cores" in launch.reason
    assert [(r.rank, r.mode) for r in launch.ranks] == [(i, "polite") for i in range(4)]
    assert all("4 ranks on the 2 cores" in r.why for r in launch.ranks)
    assert result.to_json()["wait_modes"][0]["ranks"][3]["mode"] == "polite"
    assert backend.calls == []


def test_a_single_run_under_auto_never_switches(tmp_path: Path) -> None:
    backend = Recording(_wait_cluster())
    store = Store(tmp_path / "r.db")
    settings = LoopSettings(runs_root=tmp_path / "runs", wait_mode="auto",
                            controller=ControllerSettings(max_concurrent=1))  # fmt: skip
    result = run_jobs(backend, store, OneJob(_wait_sub()), settings)
    assert result.results[0].status == "completed"
    assert backend.calls == [] and _wait_events(store) == []
    assert backend.specs[0].shim == ShimSpec("spin", "openmpi")
    assert backend.specs[0].env["OMPI_MCA_mpi_yield_when_idle"] == "0"


def test_a_fixed_spin_on_too_few_cores_spins_with_the_mpi_librarys_yield(tmp_path: Path) -> None:
    backend = Recording(_wait_cluster(cores=2))
    sub = Submission(case="box", weights=(1.0,) * 4, budget_millis=2000, sizing="fixed")
    settings = LoopSettings(runs_root=tmp_path / "runs", wait_mode="spin")
    result = run_jobs(backend, Store(tmp_path / "r.db"), OneJob(sub), settings).results[0]
    assert result.status == "completed"
    assert backend.specs[0].shim == ShimSpec("spin", "openmpi")
    assert backend.specs[0].env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert result.wait_modes[0].reason == "--wait spin (fixed)"


def test_a_fixed_mode_is_launched_as_given_and_never_switched(tmp_path: Path) -> None:
    backend = Recording(_wait_cluster())
    store = _two(tmp_path, backend, wait="polite")
    assert [s.shim.wait_mode for s in backend.specs if s.shim] == ["polite", "polite"]
    assert backend.calls == [] and _wait_events(store) == []


def test_a_refused_switch_is_recorded_once_and_asked_for_again(tmp_path: Path) -> None:
    backend = Recording(_wait_cluster(cores=3), refuse=3)
    store = _two(tmp_path, backend)
    failed = [e for e in store.events() if e.kind == "wait-mode-failed"]
    assert 1 <= len(failed) <= 2  # once per (simulation, mode)
    assert "not published" in failed[0].detail["reason"]
    assert len(backend.calls) == 3 + 2  # three refusals, then the two switches
    assert [m for _, m in _wait_events(store)] == ["polite", "spin"]
