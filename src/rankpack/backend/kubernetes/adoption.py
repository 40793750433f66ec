"""Simulations an earlier rankpack process launched: listed, and taken over (`adopt`).

`KubernetesBackend.list` calls `listed` (each simulation's owner ConfigMap, with its phase)
and `KubernetesBackend.adopt` calls `adopt`, which returns the record of a simulation whose
pods the poller follows again. Its mpirun (not our child) is known to have ended by the
exit file it leaves on the case volume; the launch marker (`exitwrapper.state`) says
whether mpirun was ever started.
"""

from __future__ import annotations

import json
from pathlib import Path

from rankpack import untrusted
from rankpack.backend.kubernetes import observe
from rankpack.backend.kubernetes.api.config import parse_volume
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.backend.kubernetes.launch import create_failure, prepare
from rankpack.backend.kubernetes.objects import builders, grouppods, reconcile, status
from rankpack.backend.kubernetes.objects.groups import plan_groups, split_group
from rankpack.backend.kubernetes.poller import check_adopted
from rankpack.backend.kubernetes.record import Lifecycle, SimRecord, rank_dir
from rankpack.backend.kubernetes.starting import exitwrapper, podmode
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.protocol import (
    LaunchFailed,
    LaunchRefused,
    SimPhase,
    SimRef,
    SimSpec,
    UnknownSimulation,
)
from rankpack.core.failures import Failure, FailureCode
from rankpack.errors import UserError

C = builders.CONTAINER


def listed(state: BackendState, poll_error: str | None) -> tuple[SimRef, ...]:
    """Every simulation whose owner ConfigMap is in the namespace (but those this process
    released), with its phase: from its record if it has one, else from its exit file."""
    refs = []
    for owner in state.api.list("configmaps", builders.OWNERS_SELECTOR):
        lab = dict(owner.get("metadata", {}).get("labels") or {})
        sim_id = lab.get(builders.SIM_LABEL, "")
        sim = state.sims.get(sim_id)
        if sim is not None and sim.life.released:
            continue
        phase = observe.phase(sim, poll_error)[0] if sim is not None else _phase_from_exit(owner)
        refs.append(SimRef(sim_id, phase, lab))
    return tuple(refs)


def adopt(state: BackendState, sim_id: str, spec: SimSpec) -> SimRecord:
    """The record of a simulation an earlier process launched. If mpirun was never started
    (the earlier process died mid-launch), the rank pods (and in pod mode the launcher pod)
    are created if missing and mpirun is started once they run. A simulation with a
    launcher pod is followed through it (pod mode: running, ended, or lost)."""
    launch = exitwrapper.state(rank_dir(spec.case_dir))
    owner = _owner(state, sim_id, launch)
    recorded = json.loads(owner.get("data", {}).get("spec.json", "{}"))
    image = str(recorded.get("image") or spec.image or state.config.image)
    try:
        volume = parse_volume(spec.volume, spec.case_dir)
    except UserError as exc:
        raise LaunchFailed(str(exc)) from exc
    life = Lifecycle(adopted=True)
    if launch != "never":
        life.start()
    in_pod = state.config.launcher == "pod"
    pods = state.pods_left(sim_id)(0.0) if owner else []
    groups = grouppods.groups_of_pods(pods, len(spec.ranks))
    if groups is None:  # none created yet (or not as this rankpack makes them)
        groups = plan_groups(len(spec.ranks), spec.rank_nodes)
        if pods and launch != "never":
            life.fail(Failure(FailureCode.OTHER, "its pods do not hold its ranks as rank "
                              "groups (launched by an older rankpack?); stop it and launch "
                              "it again"))  # fmt: skip
    sim = SimRecord(spec=spec, image=image, volume=volume, desired=list(spec.ranks),
                    groups=groups, life=life, in_pod=in_pod and launch == "never")  # fmt: skip
    if launch == "never":
        _create_missing(state, sim)
    exists = bool(owner) or (launch == "never" and sim.reconcile_error is None)
    launcher_pod = _take_pods(sim, state.pods_left(sim_id)(0.0)) if exists else None
    if launcher_pod is not None:  # pod mode: the launcher pod says where it stands
        podmode.adopted(sim, launcher_pod)
    elif launch == "died":
        life.fail(
            podmode.lost_on_adoption(sim) if in_pod else
            Failure(FailureCode.OTHER,
                    "its launcher and mpirun ended without an exit code (killed?)")
        )  # fmt: skip
    if launch == "ended":
        check_adopted(sim)
    # the log is delivered from its start, as the protocol says: the adopting
    # controller parses it afresh (sim.log starts at offset 0)
    return sim


def _owner(state: BackendState, sim_id: str, launch: str) -> Obj:
    """The simulation's owner ConfigMap; empty when it is gone but the simulation either
    ended (released, but the process that released it died before it recorded the end:
    finish it from its exit code and log) or never started (the earlier process died before
    the objects were created: create them now)."""
    try:
        return state.api.get("configmaps", builders.owner_name(sim_id))
    except ApiError as exc:
        if not exc.not_found:
            raise
        if launch in ("running", "died"):
            raise UnknownSimulation(
                f"no simulation {sim_id} in {state.api.namespace} (its objects were "
                "deleted while it ran)"
            ) from exc
        return {}


def _create_missing(state: BackendState, sim: SimRecord) -> None:
    """Whatever the earlier process got to (owner, service, some rank pods): creating is
    get-or-create, so the missing ones are made and the existing ones kept."""
    sim_id = sim.spec.sim_id
    if sim.in_pod:
        builders.check_launcher_name(sim_id)
    prepare(state, sim)
    try:
        sim.created_rv = reconcile.reconcile(
            state.api, sim.spec, sim.groups, sim.image, sim.volume,
            launcher=podmode.options_of(sim, state.config, state.api.namespace),
            bounds=state.config.pod_bounds,
        )  # fmt: skip
    except ApiError as exc:
        if not exc.transient:
            reconcile.undo(state.api, sim_id)  # no partial gang, whatever the reason
            why = f"cannot create the rank pods of {sim_id}: {exc}"
            if exc.quota_exceeded:
                raise LaunchRefused(why) from exc
            raise LaunchFailed(why, create_failure(exc)) from exc
        sim.reconcile_error = str(exc)


def _take_pods(sim: SimRecord, pods: list[Obj]) -> Obj | None:
    """The simulation's rank pods taken into its record (what each asks for now); its
    launcher pod, if it has one."""
    launcher_pod: Obj | None = None
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        if labels.get(builders.ROLE_LABEL) == builders.LAUNCHER_ROLE:
            launcher_pod = pod
            continue
        ranks = grouppods.pod_ranks(pod)
        if not ranks or ranks[-1] >= sim.n or pod["metadata"].get("name") != sim.pod_name(ranks[0]):
            continue
        want = status.desired(pod, C)
        if want is not None:
            sim.desired[ranks[0] : ranks[-1] + 1] = split_group(
                want, [sim.desired[r] for r in ranks]
            )
        for rank in ranks:
            sim.pods[rank] = pod
            sim.seen.add(rank)
    return launcher_pod


def _phase_from_exit(owner: Obj) -> SimPhase:
    try:
        case_dir = Path(json.loads(owner.get("data", {}).get("spec.json", "{}"))["case_dir"])
        text = untrusted.read_text(rank_dir(case_dir) / "mpirun.exit", 64).strip()
    except (OSError, KeyError, ValueError):
        return SimPhase.RUNNING
    return SimPhase.SUCCEEDED if text == "0" else SimPhase.FAILED
