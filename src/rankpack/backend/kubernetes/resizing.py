"""A rank's CPU resized in place: the ``pods/resize`` request and what its answer says.

`KubernetesBackend.resize` calls `resize` with the simulation's record; the poller follows
a pending resize from the pod's status afterwards (`poller`). Each outcome is kept in the
record (`record.PodResize`) under the backend's lock (`state.BackendState`).
"""

from __future__ import annotations

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.objects import builders, status
from rankpack.backend.kubernetes.record import PodResize, SimRecord
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.protocol import BackendError, RankResources, ResizeState, ResizeStatus
from rankpack.core.failures import FailureCode

C = builders.CONTAINER


def resize(
    state: BackendState, sim: SimRecord, rank: int, resources: RankResources
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
    name = builders.pod_name(sim_id, rank)
    try:
        pod = state.api.patch_resize(name, builders.resize_patch(resources))
    except ApiError as exc:
        st = result(*_refusal(exc))
        with state.lock:
            sim.resizes[rank] = PodResize(st, resources, None)
        change = f"cpu {old.request_millis}m -> {resources.request_millis}m"
        why = "QuotaExceeded" if exc.quota_exceeded else "ResizeRejected"
        state.record_event(sim, rank, why, f"{change}: {st.reason}")
        return st
    generation = pod.get("metadata", {}).get("generation")
    gen = int(generation) if generation is not None else None
    reading = status.resize_state(pod, C, resources, gen)
    if reading.state is ResizeState.COMPLETED:
        st = result(ResizeState.COMPLETED, latency=state.clock() - t0)
    else:
        st = result(ResizeState.PENDING)
    with state.lock:
        sim.desired[rank] = resources
        sim.resizes[rank] = PodResize(st, resources, gen)
    return st


def _refusal(exc: ApiError) -> tuple[ResizeState, str, None, FailureCode | None]:
    """The state, reason and code of a resize the apiserver did not take.

    1.36 refuses a resize above the node's allocatable with Forbidden; validation errors
    are 422; a vanished pod 404: all are final, the rank keeps its CPU. An unreachable or
    overloaded apiserver, or a conflict, is FAILED: the control loop asks again with
    back-off; a refusal is REJECTED. A grow past the namespace's quota (another tenant took
    it since the plan) is refused with its own code: the rank keeps its CPU, nothing fails.
    """
    transient = exc.transient or exc.conflict
    state = ResizeState.FAILED if transient else ResizeState.REJECTED
    code = (
        FailureCode.QUOTA_EXCEEDED if exc.quota_exceeded
        else FailureCode.OUTSIDE_LIMIT_RANGE if exc.outside_limit_range
        else None
    )  # fmt: skip
    reason = f"{exc.reason}: {exc.message}" if exc.message else str(exc)
    return state, reason, None, code
