"""Pure readings of a rank pod's JSON: phase, what is allocated, the state of a resize.

`KubernetesBackend` calls these on the pods it lists; unit tests feed them pod statuses as
the apiserver returns them. A resize is judged from the pod's status, not from the patch
call returning (KEP-1287 as of 1.33+):

- ``PodResizePending`` (reason ``Deferred`` or ``Infeasible``): accepted, not applied;
- ``PodResizeInProgress``: the kubelet is applying it (reason ``Error`` → it failed);
- completed: neither condition, ``status.observedGeneration`` caught up with the
  generation the patch produced, and ``containerStatuses[].resources`` (else
  ``allocatedResources``) shows the new CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from rankpack.backend.protocol import RankPhase, RankResources, ResizeState
from rankpack.core.failures import Failure, FailureCode

Obj = dict[str, Any]

_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}


def cpu_millis(quantity: str | int | float | None) -> int | None:
    """A CPU quantity (``500m``, ``1``, ``1.5``, ``250000u``) in millicores."""
    if quantity is None:
        return None
    text = str(quantity).strip()
    suffix = text[-1] if text and text[-1] in "num" else ""
    number = text[: len(text) - len(suffix)]
    try:
        value = Decimal(number) * _SUFFIX[suffix] * 1000
    except InvalidOperation:
        return None
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def container_status(pod: Obj, container: str, *, init: bool = False) -> Obj | None:
    """The status of ``container`` (``init``: of the init container of that name)."""
    key = "initContainerStatuses" if init else "containerStatuses"
    for cs in pod.get("status", {}).get(key) or []:
        if cs.get("name") == container:
            return dict(cs)
    return None


def container_spec(pod: Obj, container: str) -> Obj | None:
    for c in pod.get("spec", {}).get("containers") or []:
        if c.get("name") == container:
            return dict(c)
    return None


def _cpu_of(section: Obj | None) -> int | None:
    return cpu_millis((section or {}).get("cpu"))


def desired(pod: Obj, container: str) -> RankResources | None:
    """What the pod's spec asks for now."""
    c = container_spec(pod, container)
    if c is None:
        return None
    res = c.get("resources") or {}
    request = _cpu_of(res.get("requests"))
    if request is None:
        return None
    return RankResources(request, _cpu_of(res.get("limits")))


def allocated(pod: Obj, container: str) -> RankResources | None:
    """What the kubelet has applied: ``containerStatuses[].resources``, else
    ``allocatedResources`` (None before the container runs)."""
    cs = container_status(pod, container)
    if cs is None:
        return None
    res = cs.get("resources")
    if res and _cpu_of(res.get("requests")) is not None:
        request = _cpu_of(res.get("requests"))
        assert request is not None
        return RankResources(request, _cpu_of(res.get("limits")))
    request = _cpu_of(cs.get("allocatedResources"))
    return RankResources(request, None) if request is not None else None


def running(pod: Obj, container: str) -> bool:
    cs = container_status(pod, container)
    return (
        pod.get("status", {}).get("phase") == "Running"
        and cs is not None
        and "running" in (cs.get("state") or {})
        and not pod.get("metadata", {}).get("deletionTimestamp")
    )


def rank_phase(pod: Obj | None, container: str) -> RankPhase:
    if pod is None:
        return RankPhase.FAILED
    phase = pod.get("status", {}).get("phase")
    if phase == "Succeeded":
        return RankPhase.SUCCEEDED
    if phase == "Failed" or failure(pod, container) is not None:
        return RankPhase.FAILED
    return RankPhase.RUNNING if running(pod, container) else RankPhase.PENDING


def restarts(pod: Obj | None, container: str) -> int:
    cs = container_status(pod or {}, container)
    return int(cs.get("restartCount", 0)) if cs else 0


_CANNOT_START = ("ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull",
                 "CreateContainerConfigError", "CreateContainerError", "InvalidImageName",
                 "RunContainerError")  # fmt: skip
"""A container waiting for one of these will not start without someone's help."""
CANNOT_START_REASONS = _CANNOT_START
"""The same, for readers of other pods than rank pods (the launcher pod, `podmode`)."""

_NODE_GONE = ("DeletionByPodGC",)
"""The DisruptionTarget reason of a pod PodGC deletes because its node no longer exists."""
NODE_GONE_REASONS = _NODE_GONE
"""The same, for readers of other pods than rank pods (the launcher pod, `podmode`)."""
CONTAINER_LOST = "ContainerStatusUnknown"
"""The terminated reason a kubelet gives a container it cannot find when it starts again:
the node stopped (crashed, powered off) with it running, and came back."""


def failure(pod: Obj, container: str) -> Failure | None:
    """Why a rank pod can no longer run its rank, as a code and a message naming the pod
    (None while it can)."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status", {})
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None:  # evicted (Eviction API, preemption, taint manager, node pressure)
        why = str(disruption.get("reason") or "DisruptionTarget")
        message = str(disruption.get("message") or "")
        code = FailureCode.NODE_LOST if why in _NODE_GONE else FailureCode.EVICTED
        text = f"rank pod {name} was evicted ({why}" + (f": {message})" if message else ")")
        return Failure(code, text)
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return Failure(FailureCode.POD_DELETED, f"rank pod {name} was deleted")
    cs = container_status(pod, container)
    terminated = ((cs or {}).get("state") or {}).get("terminated")
    ended = _terminated_code(terminated) if terminated else FailureCode.CANNOT_START
    if status.get("reason") == "Evicted" or status.get("phase") == "Failed":
        why = status.get("reason") or "Failed"
        message = status.get("message") or ""
        code = {"Evicted": FailureCode.EVICTED, "NodeLost": FailureCode.NODE_LOST}.get(why, ended)
        return Failure(code, f"rank pod {name} {why.lower()}" + (f": {message}" if message else ""))
    if terminated:
        return Failure(
            ended,
            f"rank pod {name}'s container ended ({terminated.get('reason', '?')}, "
            f"exit code {terminated.get('exitCode', '?')})",
        )
    waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in _CANNOT_START:
        return Failure(
            FailureCode.CANNOT_START,
            f"rank pod {name} cannot start: {waiting['reason']}: {waiting.get('message', '')}",
        )
    return None


def _terminated_code(terminated: Obj) -> FailureCode:
    if terminated.get("reason") == "OOMKilled":
        return FailureCode.OOM_KILLED
    if terminated.get("reason") == CONTAINER_LOST:
        return FailureCode.NODE_LOST  # its node stopped under it (seen once it came back)
    return FailureCode.CONTAINER_EXITED


def unschedulable(pod: Obj | None) -> str | None:
    """The scheduler's reason a pod has no node (its ``PodScheduled`` condition False for
    ``Unschedulable``), None while it has one or may yet get one."""
    if pod is None or (pod.get("spec") or {}).get("nodeName"):
        return None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled", "False", "Unschedulable"):  # fmt: skip
            return str(cond.get("message") or "Unschedulable")[:300]
    return None


def pending_reason(pod: Obj | None) -> str:
    """Why a pod is not running yet, for `SimObservation.reason` (e.g. Unschedulable)."""
    if pod is None:
        return "pod not created yet"
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'unscheduled')}: {cond.get('message', '')}".strip()
    return str(pod.get("status", {}).get("phase", "Pending"))


def _condition(pod: Obj, kind: str) -> Obj | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


@dataclass(frozen=True)
class ResizeReading:
    state: ResizeState
    reason: str = ""


def resize_state(
    pod: Obj, container: str, target: RankResources, generation: int | None
) -> ResizeReading:
    """Where a resize to ``target`` stands, from the pod's conditions and status.

    ``generation`` is ``metadata.generation`` of the pod the patch returned: a status
    whose ``observedGeneration`` is older does not describe this resize yet.
    """
    pending = _condition(pod, "PodResizePending")
    if pending is not None:
        reason, message = str(pending.get("reason", "")), str(pending.get("message", ""))
        if reason == "Infeasible":
            return ResizeReading(ResizeState.INFEASIBLE, message or reason)
        return ResizeReading(ResizeState.DEFERRED, message or reason or "Deferred")
    progress = _condition(pod, "PodResizeInProgress")
    if progress is not None:
        if progress.get("reason") == "Error":
            return ResizeReading(ResizeState.FAILED, str(progress.get("message", "Error")))
        return ResizeReading(ResizeState.IN_PROGRESS)
    observed = pod.get("status", {}).get("observedGeneration")
    if generation is not None and observed is not None and int(observed) < generation:
        return ResizeReading(ResizeState.PENDING)
    now = allocated(pod, container)
    if (
        now is not None
        and now.request_millis == target.request_millis
        and (target.limit_millis is None or now.limit_millis == target.limit_millis)
    ):
        return ResizeReading(ResizeState.COMPLETED)
    return ResizeReading(ResizeState.PENDING)


def node_allocatable_millis(node: Obj) -> int:
    return cpu_millis(node.get("status", {}).get("allocatable", {}).get("cpu")) or 0


def node_ready(node: Obj) -> bool:
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def cpu_quota(quota: Obj) -> tuple[int, int] | None:
    """(hard, used) millicores of a ResourceQuota's CPU-request entry (``requests.cpu``, else
    ``cpu``, which means the same), or None if it does not limit CPU requests."""
    st = quota.get("status") or {}
    hard, used = st.get("hard") or {}, st.get("used") or {}
    for key in ("requests.cpu", "cpu"):
        limit = cpu_millis(hard.get(key))
        if limit is not None:
            return limit, cpu_millis(used.get(key)) or 0
    return None


def pod_request_millis(pod: Obj) -> int:
    """The pod's CPU request as the scheduler counts it (containers; init containers max)."""
    spec = pod.get("spec", {})
    total = sum(
        cpu_millis((c.get("resources") or {}).get("requests", {}).get("cpu")) or 0
        for c in spec.get("containers") or []
    )
    init = max(
        (
            cpu_millis((c.get("resources") or {}).get("requests", {}).get("cpu")) or 0
            for c in spec.get("initContainers") or []
        ),
        default=0,
    )
    return max(total, init)
