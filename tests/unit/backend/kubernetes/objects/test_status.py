"""Pod status → observation: quantities, phases, failures and resize states."""

from __future__ import annotations

from typing import Any

import pytest

from rankpack.backend.kubernetes.objects import status
from rankpack.backend.protocol import RankPhase, RankResources, ResizeState
from rankpack.core.failures import FailureCode


@pytest.mark.parametrize(
    ("text", "millis"),
    [("500m", 500), ("1", 1000), ("1.5", 1500), ("250000u", 250), ("2000000n", 2), (None, None),
     ("x", None)],
    ids=["milli", "cores", "fraction", "micro", "nano", "none", "garbage"],
)  # fmt: skip
def test_cpu_millis(text: str | None, millis: int | None) -> None:
    assert status.cpu_millis(text) == millis


def pod(
    *,
    spec_cpu: str = "1000m",
    status_cpu: str | None = "500m",
    generation: int = 2,
    observed: int | None = 2,
    conditions: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    state: dict[str, Any] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": "rank",
        "restartCount": 0,
        "state": state if state is not None else {"running": {}},
    }
    if status_cpu is not None:
        cs["resources"] = {"requests": {"cpu": status_cpu}}
    st: dict[str, Any] = {"phase": phase, "containerStatuses": [cs], "conditions": conditions or []}
    if observed is not None:
        st["observedGeneration"] = observed
    return {
        "metadata": {"name": "p", "generation": generation, **meta},
        "spec": {"containers": [{"name": "rank", "resources": {"requests": {"cpu": spec_cpu}}}]},
        "status": st,
    }


def cond(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


TARGET = RankResources(1000)

RESIZE_CASES = [
    pytest.param(pod(status_cpu="1000m"), ResizeState.COMPLETED, id="applied"),
    pytest.param(pod(), ResizeState.PENDING, id="not-yet-applied"),
    pytest.param(pod(status_cpu="1000m", observed=1), ResizeState.PENDING, id="status-is-stale"),
    pytest.param(
        pod(conditions=[cond("PodResizePending", "Deferred", "Node didn't have enough")]),
        ResizeState.DEFERRED, id="deferred",
    ),
    pytest.param(
        pod(conditions=[cond("PodResizePending", "Infeasible", "Node didn't have enough cpu")]),
        ResizeState.INFEASIBLE, id="infeasible",
    ),
    pytest.param(
        pod(status_cpu="1000m", conditions=[cond("PodResizeInProgress")]),
        ResizeState.IN_PROGRESS, id="in-progress-even-if-status-shows-it",
    ),
    pytest.param(
        pod(conditions=[cond("PodResizeInProgress", "Error", "runc update failed")]),
        ResizeState.FAILED, id="kubelet-error",
    ),
    pytest.param(
        pod(status_cpu=None, observed=None) | {"status": {"phase": "Running", "containerStatuses": [
            {"name": "rank", "allocatedResources": {"cpu": "1"}, "state": {"running": {}}}]}},
        ResizeState.COMPLETED, id="older-kubelet-allocated-resources",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("p", "want"), RESIZE_CASES)
def test_resize_state(p: dict[str, Any], want: ResizeState) -> None:
    assert status.resize_state(p, "rank", TARGET, 2).state is want


def test_resize_reason_carries_the_kubelet_message() -> None:
    p = pod(conditions=[cond("PodResizePending", "Infeasible", "Node didn't have enough cpu")])
    assert status.resize_state(p, "rank", TARGET, 2).reason == "Node didn't have enough cpu"


PHASE_CASES = [
    pytest.param(pod(), RankPhase.RUNNING, None, None, id="running"),
    pytest.param(pod(phase="Pending", state={"waiting": {"reason": "ContainerCreating"}}),
                 RankPhase.PENDING, None, None, id="creating"),
    pytest.param(pod(deletionTimestamp="2026-01-01T00:00:00Z"), RankPhase.FAILED,
                 "rank pod p was deleted", FailureCode.POD_DELETED, id="deleting"),
    pytest.param(pod(deletionTimestamp="2026-01-01T00:00:00Z",
                     conditions=[cond("DisruptionTarget", "EvictionByEvictionAPI",
                                      "Eviction API: evicting")]),
                 RankPhase.FAILED, "was evicted (EvictionByEvictionAPI: Eviction API: evicting)",
                 FailureCode.EVICTED, id="evicted-by-api"),
    pytest.param(pod(phase="Failed") | {"status": {"phase": "Failed", "reason": "Evicted",
                                                   "message": "low on memory"}},
                 RankPhase.FAILED, "evicted: low on memory", FailureCode.EVICTED, id="evicted"),
    pytest.param(pod(deletionTimestamp="2026-01-01T00:00:00Z",
                     conditions=[cond("DisruptionTarget", "DeletionByPodGC",
                                      "PodGC: node no longer exists")]),
                 RankPhase.FAILED, "DeletionByPodGC", FailureCode.NODE_LOST, id="node-deleted"),
    pytest.param(pod(phase="Failed") | {"status": {"phase": "Failed", "reason": "NodeLost"}},
                 RankPhase.FAILED, "nodelost", FailureCode.NODE_LOST, id="node-lost"),
    pytest.param(pod(state={"terminated": {"reason": "OOMKilled", "exitCode": 137}}),
                 RankPhase.FAILED, "OOMKilled, exit code 137", FailureCode.OOM_KILLED,
                 id="oom-killed"),
    pytest.param(pod(state={"terminated": {"reason": "Error", "exitCode": 1}}),
                 RankPhase.FAILED, "Error, exit code 1", FailureCode.CONTAINER_EXITED,
                 id="container-exited"),
    # its node stopped with it running and came back: the kubelet cannot find the container
    pytest.param(pod(phase="Failed", state={"terminated": {
                     "reason": "ContainerStatusUnknown", "exitCode": 137,
                     "message": "The container could not be located when the pod was terminated"}}),
                 RankPhase.FAILED, "rank pod p failed", FailureCode.NODE_LOST,
                 id="lost-with-its-node"),
    pytest.param(pod(phase="Failed", state={"terminated": {"reason": "OOMKilled",
                                                           "exitCode": 137}}),
                 RankPhase.FAILED, "rank pod p failed", FailureCode.OOM_KILLED,
                 id="failed-pod-oom-killed"),
    pytest.param(pod(phase="Failed") | {"status": {"phase": "Failed", "reason": "OutOfcpu"}},
                 RankPhase.FAILED, "outofcpu", FailureCode.CANNOT_START, id="refused-by-kubelet"),
    pytest.param(pod(phase="Pending", state={"waiting": {"reason": "ErrImageNeverPull"}}),
                 RankPhase.FAILED, "ErrImageNeverPull", FailureCode.CANNOT_START,
                 id="image-missing"),
]  # fmt: skip


@pytest.mark.parametrize(("p", "phase", "why", "code"), PHASE_CASES)
def test_phase_and_failure(
    p: dict[str, Any], phase: RankPhase, why: str | None, code: FailureCode | None
) -> None:
    assert status.rank_phase(p, "rank") is phase
    failure = status.failure(p, "rank")
    if why is None:
        assert failure is None
    else:
        assert failure is not None and why in failure.message
        assert failure.code is code


def test_allocated_and_desired() -> None:
    p = pod()
    assert status.desired(p, "rank") == RankResources(1000)
    assert status.allocated(p, "rank") == RankResources(500)
    assert status.allocated({"status": {}}, "rank") is None


def test_pod_request_counts_containers_and_init_max() -> None:
    p = {"spec": {"containers": [{"resources": {"requests": {"cpu": "100m"}}},
                                 {"resources": {"requests": {"cpu": "1"}}}],
                  "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]}}  # fmt: skip
    assert status.pod_request_millis(p) == 2000


def test_pending_reason_names_unschedulable() -> None:
    p = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."}]}}  # fmt: skip
    assert status.pending_reason(p).startswith("Unschedulable: 0/1 nodes")
