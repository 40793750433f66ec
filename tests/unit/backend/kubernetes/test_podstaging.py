"""What a staging pod's status says (`podstaging.outcome`): its answer, or why it has none."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes import podstaging
from rankpack.backend.kubernetes.api.config import StagingBounds
from rankpack.case import staging
from rankpack.case.staging import StageRefused, StageSpec
from rankpack.errors import UserError

BOUNDS = StagingBounds(deadline_s=60, memory_mib=2048)


def _pod(phase: str, terminated: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {}}
    return {"status": {"phase": phase, **status,
                       "containerStatuses": [{"name": "stage", "state": state}]}}  # fmt: skip


def test_a_running_pod_has_no_answer_yet() -> None:
    assert podstaging.outcome(_pod("Running"), BOUNDS) is None
    assert podstaging.outcome({"status": {"phase": "Pending"}}, BOUNDS) is None


def test_the_termination_message_is_the_answer() -> None:
    assert podstaging.outcome(_pod("Succeeded", {"exitCode": 0, "message": '{"ok":1}'}),
                              BOUNDS) == '{"ok":1}'  # fmt: skip


def test_a_pod_past_its_deadline_says_so() -> None:
    got = podstaging.outcome(_pod("Failed", reason="DeadlineExceeded"), BOUNDS)
    assert isinstance(got, StageRefused) and "deadline of 60 s" in str(got)


def test_out_of_memory_and_a_silent_end_are_refusals() -> None:
    oom = podstaging.outcome(_pod("Failed", {"exitCode": 137, "reason": "OOMKilled"}), BOUNDS)
    assert isinstance(oom, StageRefused) and "memory limit (2048Mi)" in str(oom)
    silent = podstaging.outcome(_pod("Failed", {"exitCode": 1, "reason": "Error"}), BOUNDS)
    assert isinstance(silent, StageRefused) and "without an answer" in str(silent)
    gone = podstaging.outcome({"status": {"phase": "Failed", "message": "evicted"}}, BOUNDS)
    assert isinstance(gone, StageRefused) and "evicted" in str(gone)


def test_a_pod_that_cannot_start_or_is_deleted_fails_now_not_at_its_deadline() -> None:
    waiting = {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}
    pod = {"status": {"phase": "Pending", "containerStatuses": [{"name": "stage",
                                                                 "state": waiting}]}}  # fmt: skip
    got = podstaging.outcome(pod, BOUNDS)
    assert isinstance(got, StageRefused)
    assert "cannot start its stage container (ErrImageNeverPull: image not" in str(got)
    # still being pulled, or still scheduled: it may yet start
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    assert podstaging.outcome(pod, BOUNDS) is None
    deleted = {"metadata": {"deletionTimestamp": "2026-11-29T00:00:00Z"}, **_pod("Running")}
    got = podstaging.outcome(deleted, BOUNDS)
    assert isinstance(got, StageRefused) and "deleted before it answered" in str(got)


def _init(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"phase": "Pending", "initContainerStatuses": [
        {"name": name, "state": state}]}}  # fmt: skip


def test_a_sidecar_or_tools_container_that_cannot_start_fails_the_staging_now() -> None:
    """The Simulation's image (the OpenFOAM sidecar) not there, a sidecar that keeps
    failing, or tools that could not be put in place: the main container would never
    start, so the staging fails at once, naming the container."""
    pull = _init("openfoam", {"waiting": {"reason": "ErrImagePull", "message": "no such image"}})
    got = podstaging.outcome(pull, BOUNDS)
    assert isinstance(got, StageRefused)
    assert "cannot start its openfoam container (ErrImagePull: no such image)" in str(got)
    looping = _init("openfoam", {"waiting": {"reason": "CrashLoopBackOff"}})
    assert "openfoam container (CrashLoopBackOff)" in str(podstaging.outcome(looping, BOUNDS))
    tools = _init("tools", {"terminated": {"exitCode": 1, "message": "cannot put the tools"}})
    got = podstaging.outcome(tools, BOUNDS)
    assert isinstance(got, StageRefused)
    assert "tools could not be put in place (exit 1: cannot put the tools)" in str(got)
    # started, or done: nothing to say
    assert podstaging.outcome(_init("openfoam", {"running": {}}), BOUNDS) is None
    done = _init("tools", {"terminated": {"exitCode": 0, "reason": "Completed"}})
    assert podstaging.outcome(done, BOUNDS) is None


def test_a_pod_bound_to_a_lost_node_before_it_started_is_stranded() -> None:
    """No kubelet will start it, or end it at its deadline: it is made again elsewhere."""
    pending = _pod("Pending") | {"spec": {"nodeName": "n1"}}
    lost = {"n1": "Ready=Unknown"}
    assert (
        podstaging.stranded(pending, lost)
        == "its node n1 was lost (Ready=Unknown) before it started"
    )
    assert podstaging.stranded(pending, {}) is None  # its node is there: it will start
    running = _pod("Running") | {"spec": {"nodeName": "n1"}}
    assert podstaging.stranded(running, lost) is None  # started: its end says what happened
    assert podstaging.stranded(_pod("Pending"), lost) is None  # not scheduled yet


def test_a_run_directory_the_volume_refuses_names_the_volume_and_who_must_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(runs_root: Path, name: str, n_ranks: int) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(staging, "new_run_dir", refused)
    stager = podstaging.PodStaging(state=None)  # type: ignore[arg-type]  # (unused here)
    with pytest.raises(UserError) as got:
        stager._run_dir(StageSpec("s", "pitzDaily", 2, tmp_path / "runs"))
    text = str(got.value)
    assert f"cannot be made in {tmp_path / 'runs'}: Permission denied" in text
    assert f"writable by uid {os.geteuid()}" in text
