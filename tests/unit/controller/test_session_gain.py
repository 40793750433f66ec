"""A session's gain is co-location's (issue 42): its single-run baselines start as its
runs do, and idle stretches, staging ahead and other wait modes are named apart (simulated
backend, virtual time; `controller.effects` alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.controller.baselines import measure_baselines
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.effects import SimSpans, session_effects
from rankpack.controller.session import run_session
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.report.gain import gain_lines
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=50, cell_work_s=1e-4)
# the shape: 4 ranks on equal subdomains, requests 1:1:5:15 of 2 cores, 2 cores: its
# plan starves the light ranks until profiled and sized; learned sizes start it sized
SUB = Submission(case="box", weights=(1.0, 1.0, 5.0, 15.0), budget_millis=2000)


def _settings(tmp_path: Path, **kw: object) -> LoopSettings:
    return LoopSettings(runs_root=tmp_path / "runs", wait_mode="auto",
                        controller=ControllerSettings(max_concurrent=1, **kw))  # type: ignore[arg-type]  # fmt: skip


def test_two_queued_copies_that_never_colocate_gain_nothing(tmp_path: Path) -> None:
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,)))
    store = Store(tmp_path / "r.db")
    store.submit_many("box", 4, SUB.to_json(), 2)
    settings = _settings(tmp_path)
    measured: list[str] = []
    measure_baselines(backend, store, settings, force=False,
                      on_measure=lambda sub, why: measured.append(why))  # fmt: skip
    # nothing learned yet: a first run alone learns the sizes, the baseline starts from them
    assert measured == ["learn", "baseline"]
    learn, base = store.all_runs()
    assert (learn.options["start"], base.options["start"]) == ("profiled", "learned")
    assert base.options["learned_from"] == learn.id
    assert learn.wall_s and base.wall_s and learn.wall_s > 1.05 * base.wall_s  # the cause
    result = run_session(backend, store, settings, baseline="db")
    assert result.max_concurrent_seen == 1 and result.baseline_source == "db"
    assert [s.start for s in result.simulations] == ["learned", "learned"]
    # compared with the learned baseline alone, not with the profiled run
    assert [b["runs"] for b in result.baselines] == [[base.id], [base.id]]
    assert result.sequential_s == pytest.approx(2 * base.wall_s)
    assert result.throughput_gain == pytest.approx(1.0, abs=0.03)
    # the profiled run as the baseline would have claimed a gain co-location never made
    assert 2 * learn.wall_s / result.busy_s > 1.05
    for s, b in zip(result.simulations, result.baselines, strict=True):
        assert s.wall_s == pytest.approx(b["wall_s"], rel=0.05)
        assert s.cpu_s == pytest.approx(b["cpu_s"], rel=0.05)
    data = result.to_json()
    assert data["busy_s"] == pytest.approx(data["makespan_s"], abs=0.1)
    assert data["simulations"][1]["staging_from_s"] is not None
    # a baseline is measured once: the next session of the same copies measures nothing
    store.submit_many("box", 4, SUB.to_json(), 1)
    measured.clear()
    measure_baselines(backend, store, settings, force=False,
                      on_measure=lambda sub, why: measured.append(why))  # fmt: skip
    assert measured == []


def test_a_single_run_that_started_otherwise_is_no_baseline(tmp_path: Path) -> None:
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,)))
    store = Store(tmp_path / "r.db")
    store.submit_many("box", 4, SUB.to_json(), 1)
    settings = _settings(tmp_path)
    measure_baselines(backend, store, settings, force=False)
    store.delete_runs([r.id for r in store.all_runs() if r.options.get("start") == "learned"])
    # only the profiled run is left; the queued copy starts at the sizes it learned
    assert [r.options["start"] for r in store.all_runs()] == ["profiled"]
    result = run_session(backend, store, settings, baseline="db")
    assert result.simulations[0].start == "learned"
    assert result.baseline_source == "missing" and result.throughput_gain is None
    assert "started at learned sizes" in result.baseline_note
    assert "co-location gain: none measured" in gain_lines(result.to_json())[0]


def test_the_baselines_run_with_the_sessions_profiling_window(tmp_path: Path) -> None:
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,)))
    store = Store(tmp_path / "r.db")
    store.submit_many("box", 4, SUB.to_json(), 1)
    measure_baselines(backend, store, _settings(tmp_path, profile_s=3.0), force=False)
    (learn, _) = store.all_runs()
    (profiled,) = [e for e in store.events(run_id=learn.id) if e.kind == "profile-start"]
    assert "for 3 s" in profiled.detail["reason"]


def test_idle_staging_ahead_and_other_wait_modes_are_named_apart() -> None:
    # one after the other: run 2 staged ahead while run 1 ran (8 s of it), launched 2 s
    # after run 1 ended; it waited polite for 2 s alone, where its baseline only spun
    one = SimSpans(1, (0.0, 10.0), (-3.0, 0.0), ((0.0, "spin"),), frozenset({"spin"}))
    two = SimSpans(2, (12.0, 20.0), (1.0, 9.0), ((12.0, "polite"), (14.0, "spin")),
                   frozenset({"spin"}))  # fmt: skip
    e = session_effects([one, two])
    assert (e.busy_s, e.idle_s, e.staged_ahead_s, e.other_wait_s) == (18.0, 2.0, 8.0, 2.0)
    assert len(e.notes) == 3 and "run 2 was staged ahead: 8.0 s" in e.notes[1]
    assert "run 2 waited polite for 2.0 s while it ran alone" in e.notes[2]


def test_a_wait_mode_switched_while_sharing_is_co_locations_own() -> None:
    one = SimSpans(1, (0.0, 10.0), None, ((0.0, "spin"), (5.0, "polite")), frozenset({"spin"}))
    two = SimSpans(2, (5.0, 15.0), None, ((5.0, "polite"), (10.0, "spin")), frozenset({"spin"}))
    e = session_effects([one, two])
    assert (e.busy_s, e.idle_s, e.other_wait_s, e.notes) == (15.0, 0.0, 0.0, ())
    # an older baseline without recorded wait modes says nothing about them
    unknown = SimSpans(3, (20.0, 30.0), None, ((20.0, "polite"),), None)
    assert session_effects([unknown]).other_wait_s == 0.0


def test_the_summary_says_the_gain_and_the_other_effects_apart() -> None:
    summary = {
        "makespan_s": 40.0, "busy_s": 38.0, "idle_s": 2.0, "sequential_s": 38.5,
        "throughput_gain": 38.5 / 38.0, "max_concurrent_seen": 1,
        "other_effects": ["run 2 was staged ahead: 8.0 s of its staging ran beside another run"],
    }  # fmt: skip
    first, never, apart = gain_lines(summary)
    assert "makespan 40.0 s (38.0 s with a simulation running, 2.0 s with none)" in first
    assert "co-location gain 1.01x" in first
    assert "never ran at once" in never
    assert apart.startswith("not in the gain: run 2 was staged ahead")
