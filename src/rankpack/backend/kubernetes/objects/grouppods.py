"""Pure builders of rank-group pods: one pod per simulation per node holding that
simulation's ranks there in one container (decision 0012; the groups are `groups`'s).

Spec and group in, JSON-like dicts and the hostfile out, no I/O; the shape a group pod
shares with a rank pod is `builders.idle_pod`'s. Called by the Kubernetes backend when it
creates a simulation's objects (`reconcile` creates what these return).

MPI sees each group pod as one node: the hostfile names it once with as many slots as it
has ranks, so mpirun starts one daemon in it and its ranks talk through shared memory in
the pod's own ``/dev/shm`` (Open MPI's vader, MPICH's shm), TCP between pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rankpack.backend.kubernetes.api.config import PodBounds, VolumeSource
from rankpack.backend.kubernetes.objects.builders import (
    IDLE_COMMAND,
    RANK_LABEL,
    IdlePodShape,
    Obj,
    OwnerRef,
    idle_pod,
    is_pod_name,
    labels,
)
from rankpack.backend.kubernetes.objects.groups import (
    RankGroup,
    group_resources,
    parse_ranks_annotation,
    ranks_annotation,
)
from rankpack.backend.kubernetes.objects.keyed import key_volume, rankd_command
from rankpack.backend.protocol import BackendError, SimSpec

GROUP_LABEL = "rankpack.dev/group"
"""A group pod's label: its group's index (`RankGroup.index`)."""
RANKS_ANNOTATION = "rankpack.dev/ranks"
"""A group pod's annotation: the ranks it holds (`groups.ranks_annotation`, read back with
`groups.parse_ranks_annotation`)."""
SHM_VOLUME = "rankpack-shm"
"""A group pod's own ``emptyDir`` in memory for its ranks' shared-memory segments (Open
MPI's vader puts them in ``/dev/shm`` when it may write there, MPICH's too). A plain
emptyDir: PodSecurity ``restricted`` allows it, and it is the pod's alone (no ``hostIPC``,
nothing shared with another simulation)."""
SHM_DIR = Path("/dev/shm")
SHM_MIB_PER_RANK = 64
"""The volume's ``sizeLimit`` per rank of the group: a container's default ``/dev/shm`` is
64 MiB in all, whatever the number of ranks using it. Memory-backed, so it counts as the
pod's memory while it is written."""


def shm_volume(n_ranks: int) -> tuple[Obj, Obj]:
    """The group pod's `SHM_VOLUME` for ``n_ranks`` ranks and its mount at `SHM_DIR`."""
    size = f"{SHM_MIB_PER_RANK * n_ranks}Mi"
    volume: Obj = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    return volume, {"name": SHM_VOLUME, "mountPath": str(SHM_DIR)}


def group_pod(
    spec: SimSpec,
    group: RankGroup,
    owner: OwnerRef,
    volume: VolumeSource,
    image: str,
    service_account: str | None = None,
    bounds: PodBounds | None = None,
    keyed: bool = False,
) -> Obj:
    """The pod of ``group`` (``keyed``: entered by the simulation's key, `keyed`): named
    (and hostnamed) `RankGroup.pod_name`, the simulation's labels plus `GROUP_LABEL`, its
    ranks in `RANKS_ANNOTATION`, one container whose CPU is its ranks' together
    (`groups.group_resources`), a required affinity to the group's node when it has one,
    its own `SHM_VOLUME` at ``/dev/shm``; the rest as a rank pod's (`builders.idle_pod`).
    BackendError if the spec has no such ranks, or some of the group's ranks have limits
    and others not."""
    if group.ranks[-1] >= len(spec.ranks):
        raise BackendError(
            f"rank group {group.index} holds rank {group.ranks[-1]}; the simulation has "
            f"{len(spec.ranks)} ranks"
        )
    own_labels = labels(spec, **{GROUP_LABEL: str(group.index)})
    own_labels.pop(RANK_LABEL, None)  # (a run's own labels cannot make it one rank's pod)
    shape = IdlePodShape(
        name=group.pod_name(spec.sim_id),
        labels=own_labels,
        resources=group_resources([spec.ranks[r] for r in group.ranks]),
        node=group.node,
        annotations={RANKS_ANNOTATION: ranks_annotation(group)},
        volumes=(
            shm_volume(len(group.ranks)),
            *((key_volume(owner.name),) if keyed else ()),
        ),
        bounds=bounds,
        n_ranks=len(group.ranks),
        command=rankd_command(spec.case_dir) if keyed else IDLE_COMMAND,
    )
    return idle_pod(spec, shape, owner, volume, image, service_account)


def group_hostfile(sim_id: str, groups: Sequence[RankGroup], flavour: str = "openmpi") -> str:
    """One line per group pod in group order (so in rank order: mpirun fills each entry's
    slots before the next), as many slots as the group has ranks, in the MPI's own format:
    Open MPI's ``POD slots=K``, MPICH hydra's ``POD:K``."""
    line = "{} slots={}\n" if flavour == "openmpi" else "{}:{}\n"
    return "".join(line.format(g.pod_name(sim_id), len(g.ranks)) for g in groups)


def check_group_pod_names(sim_id: str, groups: Sequence[RankGroup]) -> None:
    """BackendError unless every group pod's name can be a hostname (a DNS label of at most
    63 characters; ``-g<k>`` is a character longer than a rank pod's ``-<rank>``)."""
    for group in groups:
        name = group.pod_name(sim_id)
        if not is_pod_name(name):
            raise BackendError(
                f"simulation id '{sim_id}' cannot name its group pod {name} (lowercase "
                "letters, digits and '-', pod names of at most 63 characters)"
            )


def pod_ranks(pod: Obj) -> tuple[int, ...]:
    """The ranks a pod of the API holds: a group pod's (its `RANKS_ANNOTATION`, read by the
    strict parser); none for any other pod, or a group pod whose annotation is not a run of
    ranks (anyone who may edit the pod may have written it)."""
    meta = pod.get("metadata") or {}
    if GROUP_LABEL not in (meta.get("labels") or {}):
        return ()
    try:
        return parse_ranks_annotation(str((meta.get("annotations") or {}).get(RANKS_ANNOTATION)))
    except ValueError:
        return ()


def groups_of_pods(pods: Sequence[Obj], n_ranks: int) -> tuple[RankGroup, ...] | None:
    """A simulation's rank groups as its group pods (of the API) say them: their
    `GROUP_LABEL` and `RANKS_ANNOTATION`, checked to cover ranks ``0..n_ranks-1`` in order,
    one pod per group; None when they do not (pods missing, edited, or of an older layout)."""
    found: dict[int, RankGroup] = {}
    for pod in pods:
        ranks = pod_ranks(pod)
        label = str(((pod.get("metadata") or {}).get("labels") or {}).get(GROUP_LABEL))
        if not ranks or not label.isdigit() or int(label) in found:
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        found[int(label)] = RankGroup(int(label), str(node) if node else None, ranks)
    groups = tuple(found[i] for i in sorted(found))
    covered = [r for g in groups for r in g.ranks]
    ordered = [g.index for g in groups] == list(range(len(groups)))
    return groups if ordered and covered == list(range(n_ranks)) else None
