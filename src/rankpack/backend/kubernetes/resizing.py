"""A rank's CPU resized in place: its group pod's ``pods/resize`` and its nice value.

A rank's request is its share of its group pod's (decision 0012): the pod is resized to the
sum of its ranks' requests, then the node sets each rank's nice value within the pod
(`set_nices`, through `readings`), or at the next observation if it cannot now.

`KubernetesBackend.resize` calls `resize` with the simulation's record; the poller follows
a pending resize from the pod's status afterwards (`poller`). Each outcome is kept in the
record (`record.PodResize`) under the backend's lock (`state.BackendState`).
"""

from __future__ import annotations

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.nodes.readings import Readings
from rankpack.backend.kubernetes.objects import builders, status
from rankpack.backend.kubernetes.objects.groups import group_nices, group_resources
from rankpack.backend.kubernetes.record import PodResize, SimRecord
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.protocol import BackendError, RankResources, ResizeState, ResizeStatus
from rankpack.core.failures import FailureCode

C = builders.CONTAINER


def resize(
    state: BackendState, readings: Readings, sim: SimRecord, rank: int, resources: RankResources
) -> ResizeStatus:
    """Ask for ``rank``'s new CPU; the state known at once (completed, pending, or why it
    was refused or failed)."""
    sim_id = sim.spec.sim_id
    if not 0 <= rank < sim.n:
        raise BackendError(f"rank {rank} does not exist in {sim_id}")
    t0 = state.clock()
    old = sim.desired[rank]

    def result(
        state_: ResizeState,
        reason: str = "",
        latency: float | None = None,
        code: FailureCode | None = None,
    ) -> ResizeStatus:
        return ResizeStatus(state_, old.request_millis, resources.request_millis, t0,
                            latency_s=latency, reason=reason, code=code)  # fmt: skip

    if sim.life.over:
        st = result(ResizeState.REJECTED, "the simulation has ended")
        with state.lock:
            sim.resizes[rank] = PodResize(st, resources, None)
        return st
    group = sim.group(rank)
    name = group.pod_name(sim_id)
    wanted = [resources if r == rank else sim.desired[r] for r in group.ranks]
    try:
        target = group_resources(wanted)
        pod = state.api.patch_resize(name, builders.resize_patch(target))
    except (ApiError, BackendError) as exc:
        st = result(*_refusal(exc))
        with state.lock:
            sim.resizes[rank] = PodResize(st, target if isinstance(exc, ApiError) else resources,
                                          None)  # fmt: skip
        change = f"cpu {old.request_millis}m -> {resources.request_millis}m"
        quota = isinstance(exc, ApiError) and exc.quota_exceeded
        state.record_event(sim, rank, "QuotaExceeded" if quota else "ResizeRejected",
                           f"{change}: {st.reason}")  # fmt: skip
        return st
    generation = pod.get("metadata", {}).get("generation")
    gen = int(generation) if generation is not None else None
    reading = status.resize_state(pod, C, target, gen)
    if reading.state is ResizeState.COMPLETED:
        st = result(ResizeState.COMPLETED, latency=state.clock() - t0)
    else:
        st = result(ResizeState.PENDING)
    with state.lock:
        sim.desired[rank] = resources
        sim.resizes[rank] = PodResize(st, target, gen)
        for other in group.ranks:  # a group's earlier resize now waits for this target
            earlier = sim.resizes.get(other)
            if other != rank and earlier is not None and not earlier.status.state.final:
                earlier.target, earlier.generation = target, gen
        if len(group.ranks) > 1:
            sim.nices_due[group.index] = group_nices([group], sim.desired)
    set_nices(state, readings, sim)
    return st


def set_nices(state: BackendState, readings: Readings, sim: SimRecord) -> None:
    """Give the ranks of each group with nice values due theirs (`readings.Readings.
    set_nices`, on the group pod's node); a group whose node cannot set them now keeps them
    due (asked again at the next observation). Never under the backend's lock."""
    with state.lock:
        due = dict(sim.nices_due)
    for index, nices in sorted(due.items()):
        group = sim.groups[index]
        pod = sim.pods.get(group.ranks[0])
        if pod is None:
            continue
        try:
            readings.set_nices(sim.spec.sim_id, pod, nices)
        except BackendError:
            continue
        with state.lock:
            if sim.nices_due.get(index) == nices:
                del sim.nices_due[index]


def _refusal(exc: ApiError | BackendError) -> tuple[ResizeState, str, None, FailureCode | None]:
    """The state, reason and code of a resize the apiserver did not take.

    1.36 refuses a resize above the node's allocatable with Forbidden; validation errors
    are 422; a vanished pod 404: all are final, the rank keeps its CPU. An unreachable or
    overloaded apiserver, or a conflict, is FAILED: the control loop asks again with
    back-off; a refusal is REJECTED. A grow past the namespace's quota (another tenant took
    it since the plan) is refused with its own code: the rank keeps its CPU, nothing fails.
    """
    if not isinstance(exc, ApiError):  # (limits on some of a group's ranks only)
        return ResizeState.REJECTED, str(exc), None, None
    transient = exc.transient or exc.conflict
    state = ResizeState.FAILED if transient else ResizeState.REJECTED
    code = (
        FailureCode.QUOTA_EXCEEDED if exc.quota_exceeded
        else FailureCode.OUTSIDE_LIMIT_RANGE if exc.outside_limit_range
        else None
    )  # fmt: skip
    reason = f"{exc.reason}: {exc.message}" if exc.message else str(exc)
    return state, reason, None, code
