"""`rankpack run` end to end on this machine: real OpenFOAM, Open MPI and cgroups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from rankpack.backend import cgroups, ranknice
from rankpack.backend.local import LocalBackend
from rankpack.backend.protocol import RankResources
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.controller.views import LoopResult, SimView
from rankpack.plan.allocation import QoS
from rankpack.plan.submission import Submission
from rankpack.profile.finals import read_finals
from rankpack.store import Store
from tests.cli_runner import rankpack
from tests.integration.helpers import (
    processes_in,
    run_cgroups,
    run_json,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_pitzdaily_four_ranks_completes_and_is_recorded() -> None:
    data = run_json("run", "pitzDaily", "--ranks", "4", "--iterations", "120")
    assert data["_returncode"] == 0, data
    assert data["status"] == "completed"
    assert data["iterations"] == 120
    assert data["backend"] == "local"
    assert data["placement"]["cgroups"] == cgroups.detect().version
    assert len(data["ranks"]) == 4
    assert sum(r["cells"] for r in data["ranks"]) == 12225
    assert [r["cpu_millis"] for r in data["ranks"]] == [1000] * 4
    counter = sum(r["cpu_s_counter"] for r in data["ranks"])
    assert counter > 0.5
    # trapezoid over ~1 Hz samples agrees with the cgroup's own counter (a run long enough
    # that its first and last intervals do not dominate: 40 iterations were 32 % off once)
    assert abs(data["cpu_s"] - counter) / counter < 0.2
    assert all(r["nr_throttled"] == 0 for r in data["ranks"])
    # 4 ranks on this machine's cores, all in the run's one cgroup, Open MPI: they spin from
    # the launch with the library's own idle yield (decision 0012), never polite
    if (os.cpu_count() or 4) < 4:
        modes = data["wait_modes"]
        assert [m["mode"] for m in modes] == ["spin"], modes
        assert "its own ranks outnumber cores, in one cgroup" in modes[0]["reason"]
    run_dir = Path(data["run_dir"])
    assert (run_dir / "log.simpleFoam").is_file() and (run_dir / "processor3").is_dir()
    shown = run_json("runs", "show", str(data["id"]))
    assert shown["status"] == "completed" and shown["iterations"] == 120
    assert [r["cpu_millis"] for r in shown["ranks"]] == [1000] * 4
    listed = json.loads(rankpack("runs", "list", "--json").stdout)
    assert listed[0]["id"] == data["id"]
    assert not run_cgroups(os.getpid())


def test_every_rank_leaves_a_final_record_that_agrees_with_the_result(
    isolated_home: Path,
) -> None:
    """The shim's final records (what a controller adopting the run after its end would
    report) say what the run's result, from live observation, said: each rank's duty and
    CPU-seconds within 20 %."""
    data = run_json("run", "pitzDaily", "--ranks", "2", "--iterations", "80")
    assert data["status"] == "completed", data
    finals = read_finals(Path(data["run_dir"]) / ".rankpack" / "final", 2)
    assert sorted(finals) == [0, 1]
    for rank in data["ranks"]:
        final = finals[rank["rank"]]
        assert final.finalized
        assert rank["duty"] is not None and final.duty is not None
        assert final.duty == pytest.approx(rank["duty"], rel=0.2), (final, rank)
        assert final.cpu_s == pytest.approx(rank["cpu_s"], rel=0.2), (final, rank)


def test_source_tutorial_is_never_modified() -> None:
    src = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")
    before = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    run_json("run", "pitzDaily", "--ranks", "2", "--iterations", "3")
    assert sorted(str(p.relative_to(src)) for p in src.rglob("*")) == before


def _submission(weights: list[float], qos: QoS = QoS.REQUESTS, iters: int = 60) -> Submission:
    return Submission(
        "pitzDaily", tuple(weights), 4000, iterations=iters, qos=qos.value, sizing="fixed"
    )


class OnTick:
    """A display that runs a check on every tick once the simulation's ranks are observed."""

    def __init__(self, check: Callable[[SimView], None]) -> None:
        self.check = check

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        for view in sims:
            if view.ranks:
                self.check(view)

    def close(self) -> None:
        pass


def _run_local(
    tmp_path: Path, backend: LocalBackend, sub: Submission, check: Callable[[SimView], None],
    stop: threading.Event | None = None,
) -> LoopResult:  # fmt: skip
    settings = LoopSettings(
        runs_root=tmp_path / "runs", controller=ControllerSettings(max_concurrent=1)
    )
    store = Store(tmp_path / "r.db")
    return run_jobs(backend, store, OneJob(sub), settings, display=OnTick(check), stop=stop)


def _weights(settings: cgroups.CpuSettings) -> int:
    """The cgroup's CPU weight as written: cpu.shares on v1, cpu.weight on v2."""
    value = settings.shares if settings.shares is not None else settings.weight
    assert value is not None
    return value


def _driver_weight(driver: cgroups.CgroupDriver, millis: int) -> int:
    if driver.version == "v1":
        return cgroups.millis_to_shares(millis)
    return cgroups.millis_to_weight(millis)


def test_rank_group_weighs_requests_by_nice_and_resizes_in_place(tmp_path: Path) -> None:
    backend = LocalBackend()
    assert backend.driver is not None
    driver = backend.driver
    seen_nice: list[list[int | None]] = []
    pids_before: dict[int, str] = {}
    resized: list[int] = []
    run_shares: list[int] = []
    in_run_cgroup: list[bool] = []

    def check(view: SimView) -> None:
        seen_nice.append([backend.nice(view.sim_id, r) for r in range(4)])
        run_rel = f"{cgroups.SUBTREE}/run-{view.sim_id}-{os.getpid()}"
        run_shares.append(_weights(driver.read_settings(run_rel)))
        assert view.run_dir is not None
        pid_dir = Path(view.run_dir) / ".rankpack" / "pids"
        if len(list(pid_dir.glob("*.pid"))) == 4:
            pids = {int((pid_dir / f"rank-{i}.pid").read_text()) for i in range(4)}
            # the rank group: every rank in the run's own cgroup, none below it
            members = set(driver.pids(run_rel))
            # a rank that ended is in no cgroup: only one alive after the look counts
            strays = {p for p in pids - members if Path(f"/proc/{p}").exists()}
            in_run_cgroup.append(not strays)
            assert not driver.children(run_rel)
        if not resized and len(list(pid_dir.glob("*.pid"))) == 4 and view.log.iterations > 0:
            pids_before.update({i: (pid_dir / f"rank-{i}.pid").read_text() for i in range(4)})
            backend.resize(view.sim_id, 3, RankResources(500))
            resized.append(view.log.iterations)

    loop = _run_local(tmp_path, backend, _submission([1, 1, 5, 15], iters=150), check)
    (result,) = loop.results
    assert result.status == "completed" and result.iterations == 150, result.message
    assert in_run_cgroup and all(in_run_cgroup)
    # requests 182m, 182m, 909m, 2727m: the largest runs at nice 0, the others at the nice
    # value whose kernel weight is nearest their ratio (1/15 -> nice 12, 1/3 -> nice 5)
    assert [12, 12, 5, 0] in seen_nice
    # like a pod's cgroup, the run weighs the sum of its requests (4000m, then 1773m)
    assert run_shares[0] == _driver_weight(driver, 4000)
    assert run_shares[-1] == _driver_weight(driver, 182 + 182 + 909 + 500)
    # like kubepods, the parent of all runs weighs the machine's CPUs
    parent = _weights(driver.read_settings(cgroups.SUBTREE))
    assert parent == _driver_weight(driver, backend.capacity_millis())
    assert resized, "the run ended before a resize could be made"
    # rank 3 resized to 500m in place: now rank 2 (909m) is the largest, at nice 0
    assert [ranknice.nice_for(182, 909)] * 2 + [0, ranknice.nice_for(500, 909)] in seen_nice
    pid_dir = Path(result.run_dir) / ".rankpack" / "pids"
    # zero restarts: the same rank processes before and after the resize
    assert {i: (pid_dir / f"rank-{i}.pid").read_text() for i in range(4)} == pids_before
    assert result.ranks[3].cpu_millis == 500
    assert result.restarts == 0
    assert not run_cgroups(os.getpid())


def test_hard_limits_throttle_the_small_ranks(tmp_path: Path) -> None:
    backend = LocalBackend()
    stop = threading.Event()
    quotas: list[list[int | None]] = []
    timers: list[threading.Timer] = []

    def check(view: SimView) -> None:
        quotas.append([backend.settings(view.sim_id, r).quota_us for r in range(4)])
        if not timers:  # bounded in time once running: limits make MPI crawl
            timers.append(threading.Timer(8.0, stop.set))
            timers[0].start()

    try:
        loop = _run_local(
            tmp_path, backend, _submission([1, 1, 5, 15], QoS.LIMITS, 500), check, stop
        )
    finally:
        for timer in timers:
            timer.cancel()
    assert quotas[0] == [18200, 18200, 90900, 272700]
    assert loop.status == "interrupted"
    (result,) = loop.results
    assert result.status == "interrupted"
    assert result.ranks[0].nr_throttled > 0 and result.ranks[1].nr_throttled > 0
    assert result.ranks[0].throttled_s > 0
    assert not processes_in(Path(result.run_dir))
    assert not run_cgroups(os.getpid())


def test_limits_refused_without_allow_limits() -> None:
    proc = rankpack("run", "pitzDaily", "--qos", "limits")
    assert proc.returncode == 2
    assert "throttle" in proc.stderr and "--allow-limits" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_midway_cleans_up_and_keeps_results(
    sig: signal.Signals, isolated_home: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankpack", "run", "pitzDaily", "--iterations", "5000", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = isolated_home / "runs"
    wait_for(lambda: bool(run_cgroups(proc.pid)), 60, "the run's cgroups")
    wait_for(
        lambda: any(
            "ExecutionTime" in p.read_text(errors="replace") for p in runs.glob("*/log.simpleFoam")
        ),
        60,
        "the first iteration",
    )
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = json.loads(out)
    assert data["status"] == "interrupted"
    assert 0 < data["iterations"] < 5000
    run_dir = Path(data["run_dir"])
    assert (run_dir / "log.simpleFoam").is_file()
    assert not processes_in(run_dir)
    assert not run_cgroups(proc.pid)
    assert run_json("runs", "show", str(data["id"]))["status"] == "interrupted"


def test_sigkill_of_rankpack_leaves_nothing_running(isolated_home: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankpack", "run", "pitzDaily", "--iterations", "5000", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs = isolated_home / "runs"
    wait_for(lambda: bool(run_cgroups(proc.pid)), 60, "the run's cgroups")
    wait_for(lambda: any(runs.glob("*/processor0")), 60, "the run directory")
    run_dir = next(p for p in runs.iterdir() if not p.name.startswith("."))
    wait_for(lambda: len(processes_in(run_dir)) >= 4, 60, "the ranks")
    proc.kill()
    proc.wait()
    # mpirun got SIGTERM from the kernel (parent-death signal) and took its ranks down
    wait_for(lambda: not processes_in(run_dir), 30, "the ranks to exit")
    # the next rankpack process removes the dead owner's cgroups and marks the run
    LocalBackend()
    assert not run_cgroups(proc.pid)
    listed = json.loads(rankpack("runs", "list", "--json").stdout)
    assert listed[0]["status"] == "interrupted"
    assert (run_dir / "log.simpleFoam").is_file()


def test_aerofoil_runs_its_own_mesh_steps() -> None:
    data = run_json("run", "aerofoilNACA0012", "--ranks", "4", "--iterations", "5")
    assert data["status"] == "completed", data
    assert data["solver"] == "rhoSimpleFoam" and data["iterations"] == 5
    assert sum(r["cells"] for r in data["ranks"]) == 16000
    run_dir = Path(data["run_dir"])
    for step in ("blockMesh", "transformPoints", "extrudeMesh", "decomposePar"):
        assert (run_dir / f"log.{step}").is_file()


def test_more_ranks_than_cells_leaves_nothing(isolated_home: Path, tmp_path: Path) -> None:
    # pitzDaily's 12 225 cells are above the rank bound (4096), so the cell check is made on
    # the cavity tutorial (400 cells, meshed in a staging directory first)
    cavity = "/usr/share/doc/openfoam-examples/examples/incompressible/icoFoam/cavity/cavity"
    proc = rankpack("run", cavity, "--ranks", "401", "--iterations", "1")
    assert proc.returncode == 2
    assert "only 400 cells" in proc.stderr and proc.stderr.count("\n") == 1
    proc = rankpack("run", "pitzDaily", "--ranks", "13000", "--iterations", "1")
    assert proc.returncode == 2
    assert "at most 4096" in proc.stderr and proc.stderr.count("\n") == 1
    runs = isolated_home / "runs"
    assert not runs.exists() or not any(runs.iterdir())
    assert not (isolated_home / "rankpack.db").exists()
    # read-only commands do not create one either
    shown = rankpack("runs", "show", "1")
    assert shown.returncode == 2 and "no rankpack database" in shown.stderr
    assert not (isolated_home / "rankpack.db").exists()


def test_no_cgroups_runs_uncontained_and_says_so() -> None:
    # Uncontained, CPU comes from /proc at ~1 Hz: a lower bound (the last second of a rank
    # is not seen once its process is gone), so the run must outlast a few samples.
    data = run_json("run", "pitzDaily", "--ranks", "2", "--iterations", "150", "--no-cgroups")
    assert data["status"] == "completed" and data["placement"]["cgroups"] == "none"
    assert all(r["cpu_s_counter"] > 0 for r in data["ranks"])
    assert all(r["nr_throttled"] == 0 for r in data["ranks"])


def test_iterations_not_on_a_write_interval_still_write_the_last_step() -> None:
    data = run_json("run", "pitzDaily", "--ranks", "2", "--iterations", "7", "--no-shim")
    assert data["status"] == "completed" and data["iterations"] == 7
    run_dir = Path(data["run_dir"])
    assert (run_dir / "processor0" / "7" / "U").is_file()
    assert (run_dir / "processor1" / "7" / "p").is_file()


def test_a_rank_that_dies_fails_the_run_cleanly(isolated_home: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankpack", "run", "pitzDaily", "--iterations", "5000", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    runs = isolated_home / "runs"
    wait_for(lambda: len(list(runs.glob("*/.rankpack/pids/rank-*.pid"))) == 4, 90, "4 ranks")
    run_dir = next(runs.glob("*/.rankpack")).parent
    wait_for(lambda: "ExecutionTime" in (run_dir / "log.simpleFoam").read_text(), 60, "iterations")
    victim = int((run_dir / ".rankpack" / "pids" / "rank-2.pid").read_text())
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    data = json.loads(out)
    assert data["status"] == "failed" and data["message"]
    assert 0 < data["iterations"] < 5000
    assert not processes_in(run_dir) and not run_cgroups(proc.pid)
    assert (run_dir / "log.simpleFoam").is_file() and (run_dir / "processor2").is_dir()
    assert run_json("runs", "show", str(data["id"]))["status"] == "failed"


def _iterations_in(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count("\nExecutionTime")
    except FileNotFoundError:
        return 0


def test_phase_schedule_resizes_in_place_without_restarts(isolated_home: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankpack", "run", "pitzDaily", "--ranks", "2", "--iterations",
         "250", "--phases", "0:500,1500;0.5:1500,500", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    runs = isolated_home / "runs"

    def pid_files() -> list[Path]:
        return sorted(runs.glob("*/.rankpack/pids/rank-*.pid"))

    wait_for(lambda: len(pid_files()) == 2 and all(p.read_text().strip() for p in pid_files()),
             120, "2 rank pid files")  # fmt: skip
    pids_before = {p.name: p.read_text() for p in pid_files()}
    # read before the phase at 50 % (125 iterations) could have been applied
    run_dir = pid_files()[0].parents[2]
    assert _iterations_in(run_dir / "log.simpleFoam") < 125
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    data = json.loads(out)
    assert data["status"] == "completed" and data["iterations"] == 250
    assert Path(data["run_dir"]) == run_dir
    resizes = data["resizes"]
    # exactly the two resizes of the phase at 50 %, each completed, with the requests swapped
    assert sorted((r["rank"], r["from_millis"], r["to_millis"]) for r in resizes) == [
        (0, 500, 1500), (1, 1500, 500),
    ]  # fmt: skip
    assert all(r["status"] == "completed" and r["kind"] == "phase" for r in resizes), resizes
    assert all(r["latency_s"] is not None and r["latency_s"] >= 0 for r in resizes), resizes
    assert all(r["t_s"] > 0 for r in resizes)
    assert data["restarts"] == 0 and all(r["restarts"] == 0 for r in data["ranks"])
    assert [r["cpu_millis"] for r in data["ranks"]] == [1500, 500]
    # the same rank processes before and after the resizes
    assert {p.name: p.read_text() for p in pid_files()} == pids_before
    shown = run_json("runs", "show", str(data["id"]))
    assert shown["resizes"] == resizes
    assert shown["restarts"] == 0


def test_resize_duty_sizes_the_ranks_in_place() -> None:
    # long enough to be profiled: warm-up (10 %) then a 5 s window at 1 Hz ticks
    data = run_json(
        "run", "pitzDaily", "--ranks", "2", "--iterations", "400", "--resize", "duty",
        timeout=600,
    )  # fmt: skip
    assert data["_returncode"] == 0, data
    # pitzDaily converges (residualControl) after ~285 iterations: it may end before 400
    assert data["status"] == "completed" and 40 < data["iterations"] <= 400
    sized = [r for r in data["resizes"] if r["kind"] == "size" and r["status"] == "completed"]
    assert sized, data["resizes"]
    assert all("duty" in r["reason"] and r["latency_s"] is not None for r in sized)
    # the requests in force at the end are the sized ones
    last = {r["rank"]: r["to_millis"] for r in sized}
    assert all(data["ranks"][rank]["cpu_millis"] == m for rank, m in last.items())
    assert data["restarts"] == 0
    shown = run_json("runs", "show", str(data["id"]))
    assert shown["resizes"] == data["resizes"]
