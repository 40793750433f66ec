"""An in-flight resize from the policy's action to its outcome (`controller.resizes`), and
the rules the loop applies (`policy.retry_delay_s`, `staged.fit_launch`). Simulated backend,
virtual time."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.backend.protocol import ResizeState
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.policy import RETRY_DELAYS_S, retry_delay_s
from rankpack.controller.staged import fit_launch
from rankpack.controller.tracked import LoopSettings
from rankpack.controller.views import LoopResult
from rankpack.plan.submission import Phase, Submission
from rankpack.store import EventRow, Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import ResizeScript, SimNode, SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=200, cell_work_s=1e-4)
# a phase at 20 % lowers rank 1 (a decrease: sent at once, no hold)
PHASES = (Phase(0.0, (1000, 1000)), Phase(0.2, (1000, 600)))
SUB = Submission(case="box", weights=(1.0, 1.0), budget_millis=2000, phases=PHASES)


def _run_resizes(
    tmp_path: Path, script: ResizeScript | None, sub: Submission = SUB, **settings: object
) -> tuple[LoopResult, list[EventRow]]:
    cluster = SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,),
                               timing=SimTiming(resize_latency_s=0.2))  # fmt: skip
    if script is not None:
        cluster.script_resize(script)
    store = Store(tmp_path / "r.db")
    loop_settings = LoopSettings(runs_root=tmp_path / "runs", **settings)  # type: ignore[arg-type]  # test knobs
    result = run_jobs(SimulatedBackend(cluster), store, OneJob(sub), loop_settings)
    return result, store.events()


def test_retry_delays_back_off_then_give_up() -> None:
    assert [retry_delay_s(a) for a in range(len(RETRY_DELAYS_S))] == list(RETRY_DELAYS_S)
    assert tuple(sorted(RETRY_DELAYS_S)) == RETRY_DELAYS_S
    assert retry_delay_s(len(RETRY_DELAYS_S)) is None


def test_a_failed_resize_is_asked_again_with_back_off_until_it_completes(tmp_path: Path) -> None:
    script = ResizeScript(ResizeState.FAILED, rank=1, reason="apiserver timeout", count=2)
    result, events = _run_resizes(tmp_path, script)
    (run,) = result.results
    assert run.status == "completed"
    assert [(r.rank, r.to_millis, r.status) for r in run.resizes] == [
        (1, 600, "failed"), (1, 600, "failed"), (1, 600, "completed"),
    ]  # fmt: skip
    retries = [e.detail for e in events if e.kind == "resize-retry"]
    assert [(d["attempt"], d["delay_s"]) for d in retries] == [(1, 2.0), (2, 4.0)]
    assert result.resizes == 1 and result.resizes_rejected == 2
    asked = [e.t_s for e in events if e.kind == "resize-requested"]
    assert asked[1] - asked[0] >= 2.0 and asked[2] - asked[1] >= 4.0


def test_a_resize_that_keeps_failing_is_given_up(tmp_path: Path) -> None:
    script = ResizeScript(ResizeState.FAILED, rank=1, reason="apiserver timeout", count=99)
    result, events = _run_resizes(tmp_path, script)
    (run,) = result.results
    assert run.status == "completed"
    assert [r.status for r in run.resizes] == ["failed"] * (len(RETRY_DELAYS_S) + 1)
    (given_up,) = [e for e in events if e.kind == "resize-given-up"]
    assert given_up.detail["reason"].startswith(f"failed {len(RETRY_DELAYS_S) + 1} times")


def test_a_deferred_resize_is_recorded_once_and_settled_once(tmp_path: Path) -> None:
    script = ResizeScript(ResizeState.DEFERRED, rank=1, reason="OutOfcpu", defer_s=1e6)
    result, events = _run_resizes(tmp_path, script)
    (run,) = result.results
    (resize,) = run.resizes  # never granted: settled when the run ended, not counted
    assert (resize.rank, resize.to_millis) == (1, 600) and resize.status != "completed"
    (deferred,) = [e for e in events if e.kind == "resize-deferred"]
    assert deferred.detail["reason"].startswith("OutOfcpu; the node tries it again")
    assert result.resizes == 0 and result.resizes_rejected == 1


def test_fit_launch_scales_to_what_is_free_or_leaves_the_requests() -> None:
    assert fit_launch([1000, 1000], 2000, 50) is None  # fits
    assert fit_launch([1000, 1000], 80, 50) is None  # not even the floors: as planned
    assert fit_launch([1000, 3000], 1000, 50) == [250, 750]
    assert sum(fit_launch([333, 333, 334], 500, 50) or ()) == 500


def test_a_launch_that_must_fit_is_scaled_to_the_capacity(tmp_path: Path) -> None:
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=2000, sizing="fixed")
    controller = ControllerSettings(launch_must_fit=True)
    result, events = _run_resizes(tmp_path, None, sub, controller=controller, capacity_millis=1000)
    (run,) = result.results
    assert run.status == "completed" and [r.cpu_millis for r in run.ranks] == [500, 500]
    (fitted,) = [e for e in events if e.kind == "launch-fitted"]
    assert fitted.detail["request_millis"] == [500, 500]
    assert run.total_millis == 2000  # the plan's total, the budget, stays


@pytest.mark.parametrize("wait", ["auto", "spin", "polite", "adaptive"])
def test_a_simulations_wait_setting_is_its_own_else_the_sessions(wait: str) -> None:
    from rankpack.controller import waits

    assert waits.setting(None, wait) == wait
    assert waits.setting(wait, "spin") == wait


def test_an_unknown_wait_mode_is_a_user_error() -> None:
    from rankpack.controller import waits
    from rankpack.errors import UserError

    with pytest.raises(UserError, match="unknown wait mode 'busy'"):
        waits.setting("busy", "auto")


def test_a_simulations_own_launcher_pod_is_not_anothers() -> None:
    from rankpack.controller.observing import others_millis

    # 300m of other pods, 1300m of this loop's ranks, its launcher pod 100m
    assert others_millis(1700, 1300, launched=1, overhead=100) == 300
    assert others_millis(1700, 1300, launched=0, overhead=100) == 400  # not launched: others'
    assert others_millis(1300, 1300, launched=1, overhead=100) == 0  # not created yet: no less
