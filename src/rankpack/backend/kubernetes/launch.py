"""The launch path of the Kubernetes backend: a new simulation's checks, record and objects.

`KubernetesBackend.launch` calls `launch_sim`, which cuts the ranks into rank groups (`plan`:
the ranks on one node share a pod, decision 0012), checks the spec and the namespace's
quotas and LimitRanges (`capacity.ClusterCapacity.launch_check`), writes the files mpirun
needs on the case volume (`prepare`), creates the owner ConfigMap, the Service and the group
pods (`reconcile`) and returns the simulation's new record, for the backend to keep and its
poller to follow. Adoption (`adoption`) shares `prepare` and `create_failure`.
"""

from __future__ import annotations

from rankpack.backend.kubernetes.api.config import parse_volume
from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.nodes.capacity import ClusterCapacity
from rankpack.backend.kubernetes.objects import builders, grouppods, reconcile
from rankpack.backend.kubernetes.objects.groups import (
    RankGroup,
    group_resources,
    plan_groups,
    plan_unplaced,
    ranks_annotation,
)
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.kubernetes.starting import podmode
from rankpack.backend.kubernetes.starting.hostmpirun import prepare_files
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.protocol import BackendError, LaunchFailed, LaunchRefused, SimSpec
from rankpack.backend.worker import Stager
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError


def launch_sim(
    state: BackendState, spec: SimSpec, capacity: ClusterCapacity, stager: Stager
) -> SimRecord:
    """The record of a simulation whose owner, Service and rank pods are created. Checked
    first against the namespace's LimitRanges and quotas, read now: no room in a quota is
    `LaunchRefused` (still staged, nothing created), a rank the LimitRange refuses is
    `LaunchFailed` with its code. A create the apiserver refuses halfway (another tenant
    took the quota between that check and the create) deletes what was created
    (`reconcile.undo`: no partial gang) and is `LaunchRefused` for quota, else
    `LaunchFailed`."""
    config = state.config
    builders.check_sim_id(spec.sim_id, len(spec.ranks))
    in_pod = config.launcher == "pod"
    if in_pod:
        builders.check_launcher_name(spec.sim_id)
    groups = plan(spec, capacity)
    grouppods.check_group_pod_names(spec.sim_id, groups)
    check = capacity.launch_check([
        (f"pod {g.pod_name(spec.sim_id)} (ranks {ranks_annotation(g)})",
         group_resources([spec.ranks[r] for r in g.ranks]))
        for g in groups
    ])  # fmt: skip
    refusal = check.refusal
    if refusal is not None and refusal[0] is FailureCode.QUOTA_EXCEEDED:
        raise LaunchRefused(f"{spec.sim_id} not launched: {refusal[1]}")
    stage = stager.launched(spec.sim_id)
    if refusal is not None:
        raise LaunchFailed(f"{spec.sim_id} not launched: {refusal[1]}", refusal[0])
    try:
        volume = parse_volume(spec.volume, spec.case_dir)
    except UserError as exc:
        raise LaunchFailed(str(exc)) from exc
    image = spec.image or config.image
    sim = SimRecord(spec=spec, image=image, volume=volume, desired=list(spec.ranks),
                    groups=groups, in_pod=in_pod)  # fmt: skip
    if check.launcher_millis != config.launcher_cpu_millis:
        sim.launcher_millis = check.launcher_millis  # within the namespace's LimitRange
    prepare(state, sim)
    try:
        sim.created_rv = reconcile.reconcile(
            state.api, spec, groups, image, volume, create_first=True, bounds=config.pod_bounds,
            launcher=podmode.options_of(sim, config, state.api.namespace),
        )  # fmt: skip
    except ApiError as exc:
        if not exc.transient:
            removed = reconcile.undo(state.api, spec.sim_id)
            why = f"cannot create the rank pods of {spec.sim_id}: {exc}"
            if exc.quota_exceeded:
                stager.restore(stage)
                raise LaunchRefused(
                    f"{why} (the {removed} created were deleted; waiting for room)"
                ) from exc
            raise LaunchFailed(why, create_failure(exc)) from exc
        # The apiserver is away: the poller creates what is missing once it answers
        # (get-or-create is idempotent), bounded by start_timeout_s like any start.
        sim.reconcile_error = str(exc)
    return sim


def plan(spec: SimSpec, capacity: ClusterCapacity) -> tuple[RankGroup, ...]:
    """The simulation's rank groups: a pod per node the controller placed its ranks on;
    unplaced, one pod if every rank fits the roomiest node, else consecutive ranks split
    over the nodes by their free CPU (`groups.plan_unplaced`)."""
    if spec.rank_nodes:
        return plan_groups(len(spec.ranks), spec.rank_nodes)
    try:
        nodes = capacity.inventory().nodes
    except BackendError:  # nodes not readable: the scheduler places one pod
        nodes = ()
    room = {n.name: n.allocatable_millis - n.requested_millis for n in nodes}
    return plan_unplaced([r.request_millis for r in spec.ranks], room)


def prepare(state: BackendState, sim: SimRecord) -> None:
    """The files on the case volume mpirun needs (and in pod mode its launcher's
    instructions)."""
    prepare_files(sim)
    if sim.in_pod:
        podmode.prepare(sim, state.config)


def create_failure(exc: ApiError) -> FailureCode:
    """The code of a create the apiserver refused for good."""
    if exc.outside_limit_range:
        return FailureCode.OUTSIDE_LIMIT_RANGE
    if exc.quota_needs_limits:
        return FailureCode.QUOTA_NEEDS_LIMITS
    return FailureCode.LAUNCH_FAILED
