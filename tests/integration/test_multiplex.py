"""`rankpack submit` + `rankpack multiplex` on this machine with real OpenFOAM runs."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rankpack.backend import cgroups
from rankpack.backend.local import LocalBackend
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.session import run_session
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from tests.cli_runner import rankpack
from tests.integration.helpers import processes_in, run_cgroups, run_json, wait_for

pytestmark = pytest.mark.integration


WEIGHT_FILE = "cpu.shares" if cgroups.detect().version == "v1" else "cpu.weight"


def _kubelet_weight(millis: int) -> int:
    """What the cgroup weight file holds for a request: shares on v1, weight on v2."""
    if WEIGHT_FILE == "cpu.shares":
        return cgroups.millis_to_shares(millis)
    return cgroups.millis_to_weight(millis)


def _run_weights_of(owner_pid: int) -> dict[str, int]:
    """Each run cgroup's weight: the sum of its ranks' requests (a rank group)."""
    out: dict[str, int] = {}
    for run in run_cgroups(owner_pid):
        try:
            out[run.name] = int((run / WEIGHT_FILE).read_text())
        except OSError:
            continue
    return out


def test_three_pitzdaily_simulations_multiplexed(isolated_home: Path) -> None:
    sub = rankpack(
        "submit", "pitzDaily", "--ranks", "4", "--budget", "1", "--iterations", "280",
        "--count", "3", "--json",
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    assert json.loads(sub.stdout)["queued"] == [1, 2, 3]
    queue = json.loads(rankpack("queue", "--json").stdout)
    assert [q["status"] for q in queue] == ["queued"] * 3

    proc = subprocess.Popen(
        # --gate off: these are the multiplexer's mechanics (packing, in-place resizes,
        # records); 4 ranks on 2 cores is a shape the default gate never co-locates
        [sys.executable, "-m", "rankpack", "multiplex", "--max-concurrent", "3",
         "--profile-s", "1", "--gate", "off", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # the sessions' run cgroups exist while it runs, so "none left" below means something
    wait_for(lambda: bool(run_cgroups(proc.pid)), 300, "the multiplexer's run cgroups")
    seen: list[dict[str, int]] = []
    done = threading.Event()

    def watch() -> None:  # read the cgroup files while the multiplexer runs
        while not done.wait(0.5):
            seen.append(_run_weights_of(proc.pid))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        done.set()
        watcher.join()
    assert proc.returncode == 0, err[-3000:]
    data = json.loads(out)
    sims = data["simulations"]
    assert len(sims) == 3
    # runs must outlast warm-up + profiling (1 Hz ticks) to be sized: ~8 s each here
    assert all(s["status"] == "completed" and s["iterations"] == 280 for s in sims)
    assert data["restarts"] == 0
    assert data["gate"]["model"] == "off"
    # a first run alone (profiled) was sized in place; the baseline and the session's copies
    # start at its learned sizes, so they need no profiling window of their own
    events = json.loads(rankpack("events", "--json").stdout)
    baseline_sizes = [e for e in events if e["kind"] == "resize" and e["multiplex_id"] is None
                      and e["detail"]["kind"] == "size"]  # fmt: skip
    assert len(baseline_sizes) >= 4  # every rank of the first run sized at least once
    learned = [e for e in events if e["kind"] == "learned-sizes" and e["multiplex_id"]]
    assert len(learned) == 3  # from a single run, or from a copy running beside it
    assert Path(data["timeline_png"]).stat().st_size > 10_000
    # the session's figures are those of its recorded runs, not just well-formed numbers:
    # makespan from the first start to the last end, fairness = max/min of the recorded
    # wall times, gain = the recorded single (baseline) runs back to back / the time any ran
    spans = [(s["started_s"], s["finished_s"]) for s in sims]
    makespan = max(b for _, b in spans) - min(a for a, _ in spans)
    assert data["makespan_s"] == pytest.approx(makespan) and makespan > 0
    recorded = {s["id"]: run_json("runs", "show", str(s["id"])) for s in sims}
    walls = [r["wall_s"] for r in recorded.values()]
    assert walls == pytest.approx([s["wall_s"] for s in sims])
    assert data["fairness_ratio"] == pytest.approx(max(walls) / min(walls))
    listed = json.loads(rankpack("runs", "list", "--json").stdout)
    singles = {
        r["options"]["start"]: r for r in listed
        if r["status"] == "completed" and "multiplex_id" not in r["options"]
    }  # fmt: skip
    # measured once, before the session: the first run learned, the baseline started learned
    # as the copies did (the profiled one is no baseline for them)
    assert sorted(singles) == ["learned", "profiled"] and data["baseline"] == "db"
    assert [s["start"] for s in sims] == ["learned"] * 3
    base = singles["learned"]
    assert [b["runs"] for b in data["baselines"]] == [[base["id"]]] * 3
    assert data["busy_s"] == pytest.approx(makespan, abs=0.01) and data["idle_s"] < 0.01
    assert data["sequential_s"] == pytest.approx(3 * base["wall_s"])
    assert data["throughput_gain"] == pytest.approx(3 * base["wall_s"] / data["busy_s"])
    # the initial 4 x 250m changed in place while the ranks ran (the run's weight is the sum)
    all_weights = {w for snap in seen for w in snap.values()}
    assert _kubelet_weight(1000) in all_weights and len(all_weights) > 1
    # results intact: every run directory has its log and its last time directory
    for s in sims:
        run_dir = Path(s["run_dir"])
        assert "End" in (run_dir / "log.simpleFoam").read_text()
        shown = run_json("runs", "show", str(s["id"]))
        assert all(r["duty"] is not None and 0 < r["duty"] < 1 for r in shown["ranks"])
        assert (run_dir / "processor0" / "280").is_dir()
    # overlap: at least two simulations ran at the same time
    spans = sorted(spans)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))
    kinds = {e["kind"] for e in events}
    assert {"launch", "profile-start", "resize", "finished"} <= kinds
    sizes = [e for e in events if e["kind"] == "resize" and e["detail"]["kind"] == "size"]
    assert all("duty" in e["detail"]["reason"] for e in sizes)
    sim_events = json.loads(rankpack("events", "--sim", str(sims[0]["id"]), "--json").stdout)
    assert sim_events and all(e["run_id"] == sims[0]["id"] for e in sim_events)
    assert [q["status"] for q in json.loads(rankpack("queue", "--all", "--json").stdout)] == [
        "completed"
    ] * 3
    assert not run_cgroups(proc.pid)


def test_ctrl_c_stops_the_multiplexer_cleanly(isolated_home: Path) -> None:
    assert rankpack("submit", "pitzDaily", "--budget", "1", "--iterations", "5000",
                    "--count", "2").returncode == 0  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankpack", "multiplex", "--baseline", "none", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    runs = isolated_home / "runs"
    wait_for(lambda: any(runs.glob("*/log.simpleFoam")), 120, "the first simulation")
    run_dir = next(p for p in runs.iterdir() if (p / "log.simpleFoam").exists())
    wait_for(lambda: "ExecutionTime" in (run_dir / "log.simpleFoam").read_text(), 60, "iterations")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    data = json.loads(out)
    assert data["status"] == "interrupted"
    assert data["simulations"] and all(s["status"] == "interrupted" for s in data["simulations"])
    assert not processes_in(run_dir) and not run_cgroups(proc.pid)
    assert (run_dir / "log.simpleFoam").is_file()
    statuses = [q["status"] for q in json.loads(rankpack("queue", "--all", "--json").stdout)]
    assert "interrupted" in statuses
    assert os.path.isdir(run_dir)


def test_multiplex_bad_input(isolated_home: Path) -> None:
    empty = rankpack("multiplex")
    assert empty.returncode == 2 and "queue is empty" in empty.stderr
    assert rankpack("submit", "pitzDaily", "--iterations", "10").returncode == 0
    bad = rankpack("multiplex", "--max-concurrent", "0")
    assert bad.returncode == 2 and "--max-concurrent" in bad.stderr
    dry = run_json("multiplex", "--dry-run")
    assert dry["dry_run"] is True and dry["actions"][0]["action"] == "launch"
    # a dry run applied nothing
    assert json.loads(rankpack("queue", "--json").stdout)[0]["status"] == "queued"


class RefusingDriver:
    """The real cgroup driver, except that a run's cgroup CPU can be written only once (at
    launch): every in-place resize is refused, as a FAKE of the one boundary we cannot
    provoke here on demand (a kubelet or API server refusing a `pods/resize`, a cgroup write
    failing). The local backend itself is not faked."""

    def __init__(self, inner: cgroups.CgroupDriver) -> None:
        self.inner = inner
        self.version = inner.version
        self.written: set[str] = set()

    def set_cpu(self, rel: str, request_millis: int, limit_millis: int | None) -> object:
        if "/run-" in rel and rel in self.written:
            raise PermissionError(13, "resize refused by the test")
        self.written.add(rel)
        return self.inner.set_cpu(rel, request_millis, limit_millis)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_rejected_resizes_are_recorded_and_the_simulation_completes(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    sub = Submission("pitzDaily", (1.0,) * 4, 1000, iterations=280)
    store.submit(sub.case, sub.n_ranks, sub.to_json())
    backend = LocalBackend(driver=RefusingDriver(cgroups.detect()))  # type: ignore[arg-type]
    settings = LoopSettings(
        runs_root=tmp_path / "runs", capacity_millis=2000, wait_mode="spin",
        controller=ControllerSettings(max_concurrent=1, profile_s=1.0),
    )  # fmt: skip
    result = run_session(backend, store, settings, baseline="none")
    assert result.status == "completed"
    assert [s.status for s in result.simulations] == ["completed"]
    assert result.simulations[0].iterations == 280
    assert result.resizes == 0 and result.resizes_rejected >= 1 and result.restarts == 0
    events = store.events(multiplex_id=result.multiplex_id)
    rejected = [e for e in events if e.kind == "resize-rejected"]
    assert rejected and "refused" in rejected[0].detail["reason"]
    run = store.get_run(result.simulations[0].id)
    # every refused resize is recorded with the run, none as completed
    assert run.resizes and all(r.status == "rejected" for r in run.resizes)
    assert len(run.resizes) == result.resizes_rejected
    # the ranks kept their initial requests
    assert [r.cpu_millis for r in run.ranks] == [250] * 4
    assert not run_cgroups(os.getpid())


def test_phase_schedule_follows_the_solver_log(isolated_home: Path) -> None:
    phases = "0:400,400,400,400;0.5:150,150,600,700"
    sub = rankpack("submit", "pitzDaily", "--ranks", "4", "--budget", "2", "--iterations",
                   "200", "--phases", phases, "--json")  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    assert json.loads(sub.stdout)["submission"]["phases"][1]["request_millis"] == [
        150,
        150,
        600,
        700,
    ]
    data = run_json("multiplex", "--baseline", "none")
    assert data["_returncode"] == 0, data
    (sim,) = data["simulations"]
    assert sim["status"] == "completed" and sim["iterations"] == 200
    events = json.loads(rankpack("events", "--sim", str(sim["id"]), "--json").stdout)
    phase = [e for e in events if e["kind"] == "resize" and e["detail"]["kind"] == "phase"]
    # only the phase at 50 % changes anything (the first phase is the initial request)
    assert sorted((e["detail"]["rank"], e["detail"]["request_millis"]) for e in phase) == [
        (0, 150), (1, 150), (2, 600), (3, 700),
    ]  # fmt: skip
    assert all("50" in e["detail"]["reason"] or "0.5" in e["detail"]["reason"] for e in phase)
    # no duty-cycle sizing for a scheduled simulation
    assert not [e for e in events if e["kind"] == "resize" and e["detail"]["kind"] == "size"]
    # the transition happened mid-run, detected from the log: recorded samples show the
    # old requests before and the new ones after, with the iteration count at each sample
    store = Store(isolated_home / "rankpack.db")
    rows = store.samples(sim["id"])
    before = [r.iterations for r in rows if r.rank == 3 and r.request_millis == 400]
    after = [r.iterations for r in rows if r.rank == 3 and r.request_millis == 700]
    assert before and after and max(before) <= min(after)
    assert min(after) >= 100  # 50 % of 200 iterations
    assert data["restarts"] == 0
