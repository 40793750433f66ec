"""What `KubernetesBackend.observe` reports of one simulation, read from its record.

Readings of a `SimRecord` (called under the backend's lock): its phase and why, the
failure (code and message), each rank's observation (pod, counters and the shim's sample
from its node, `readings`, flagged when the node could not be read). Once it has ended,
`with_finals` adds each rank's final record from the case volume (outside the lock).
"""

from __future__ import annotations

from dataclasses import replace

from rankpack.backend.kubernetes.api.kubeapi import Obj
from rankpack.backend.kubernetes.nodes.nodereader import CpuCounters
from rankpack.backend.kubernetes.nodes.readings import Readings, ReadingsMissing
from rankpack.backend.kubernetes.objects import builders, status
from rankpack.backend.kubernetes.objects.groups import split_group
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.kubernetes.starting import podmode
from rankpack.backend.mpirun import ShimSample, exit_failure, read_final_records
from rankpack.backend.protocol import RankObservation, RankPhase, RankResources, SimPhase
from rankpack.core.failures import Failure

C = builders.CONTAINER


def phase(sim: SimRecord, poll_error: str | None) -> tuple[SimPhase, str]:
    """The simulation's phase and why (no side effects: `list` uses it too; ``poll_error``:
    the poller's, while the apiserver does not answer)."""
    life = sim.life
    if not life.over:
        if life.started:
            return SimPhase.RUNNING, ""
        if poll_error:
            return SimPhase.PENDING, f"the API is not answering: {poll_error}"
        if sim.reconcile_error:
            reason = f"creating its pods: {sim.reconcile_error}"
        else:
            reason = "; ".join(
                f"rank {i}: {status.pending_reason(sim.pods.get(i))}"
                for i in range(sim.n)
                if not status.running(sim.pods.get(i) or {}, C)
            )
        return SimPhase.PENDING, podmode.pending_reason(sim, reason) if sim.in_pod else reason
    failure = ended_failure(sim)
    if failure is None:
        return SimPhase.SUCCEEDED, ""
    return SimPhase.FAILED, failure.message


def ended_failure(sim: SimRecord) -> Failure | None:
    """Why a simulation that is over failed (its own failure, else what its mpirun's end
    means); None if it succeeded."""
    life = sim.life
    if life.failure is not None:
        return life.failure
    return exit_failure(life.exit_code, stopped=life.stopped)


def observe_rank(
    sim: SimRecord, i: int, ended: bool, source: Readings, missing: dict[str, str]
) -> RankObservation:
    """Rank ``i``'s observation. Its node's reading refreshes the counters and the shim
    sample kept in ``sim``; a node that cannot be read leaves them as they were, flags the
    rank (``readings_ok=False``) and adds the node and why to ``missing``."""
    pod = sim.pods.get(i)
    fresh = True
    if pod is not None and status.running(pod, C):
        try:
            reading = source.read(pod, i)
        except ReadingsMissing as exc:
            reading, fresh = None, False
            missing.setdefault(exc.node, exc.why)
        if reading is not None:
            last = sim.counters.get(i)
            cpu = reading.cpu
            if cpu is not None and (last is None or cpu.usage_ns >= last.usage_ns):
                sim.counters[i] = cpu
            if reading.shim is not None:
                sim.shim[i] = reading.shim
    counters = sim.counters.get(i) or CpuCounters(0)
    if ended:
        life = sim.life
        ok = life.exit_code == 0 and life.failure is None and not life.stopped
        phase = RankPhase.SUCCEEDED if ok else RankPhase.FAILED
    elif pod is None:
        phase = RankPhase.FAILED if i in sim.seen else RankPhase.PENDING
    else:
        phase = status.rank_phase(pod, C)
        if phase is RankPhase.RUNNING and not sim.life.started:
            phase = RankPhase.PENDING  # the pod runs; its rank does not yet
    shim = sim.shim.get(i) or ShimSample()
    resize = sim.resizes.get(i)
    return RankObservation(
        rank=i,
        phase=phase,
        desired=sim.desired[i],
        allocated=rank_allocated(sim, i, pod) if pod else None,
        usage_ns=counters.usage_ns,
        nr_throttled=counters.nr_throttled,
        throttled_ns=counters.throttled_ns,
        restarts=status.restarts(pod, C),
        reason=_failure_text(pod),
        node=(pod or {}).get("spec", {}).get("nodeName"),
        pod=sim.pod_name(i),
        resize=resize.status if resize else None,
        compute_ns=shim.compute_ns,
        mpi_ns=shim.mpi_ns,
        duty_window=shim.duty_window,
        wait_mode=shim.wait_mode,
        readings_ok=fresh,
    )


def with_finals(sim: SimRecord, ranks: tuple[RankObservation, ...]) -> tuple[RankObservation, ...]:
    """``ranks`` of a simulation whose observation says it has ended, each with its final
    record (`rankpack.backend.mpirun.read_final_records`): read the first time, kept after.
    The records are on the case volume, not in the rank pods, so a run adopted after its
    pods were gone has them too. Not under the lock: the files may be on a network volume,
    and only the control loop's thread touches ``sim.finals``."""
    if sim.finals is None:
        sim.finals = read_final_records(sim.spec)
    finals = sim.finals
    if not finals:
        return ranks
    return tuple(replace(r, final=finals.get(r.rank)) for r in ranks)


def rank_allocated(sim: SimRecord, i: int, pod: Obj) -> RankResources | None:
    """Rank ``i``'s part of what its group pod's container has (its status): the rank's
    own request once the pod has the group's sum of them (a single rank's pod: exactly its
    own), else its request scaled in the ratio of the two (a group resize under way)."""
    have = status.allocated(pod, C)
    if have is None:
        return None
    group = sim.group(i)
    return split_group(have, [sim.desired[r] for r in group.ranks])[i - group.ranks[0]]


def outages(sim: SimRecord, missing: dict[str, str]) -> list[tuple[str, str]]:
    """The nodes of ``missing`` whose outage starts with this observation (node, why); the
    nodes read again end theirs (a later outage is a new one)."""
    new = [(node, why) for node, why in sorted(missing.items()) if node not in sim.unreadable]
    sim.unreadable = set(missing)
    return new


def _failure_text(pod: Obj | None) -> str:
    found = status.failure(pod, C) if pod else None
    return found.message if found is not None else ""
