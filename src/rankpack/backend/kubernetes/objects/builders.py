"""Pure builders: a simulation's spec in, its Kubernetes objects out (mpirun's command line
is `starting.mpirunargs`).

No I/O and no client objects: every function returns plain JSON-like dicts and is
table-tested (``tests/unit/backend/kubernetes/objects/test_builders.py``).
`reconcile` creates what these return (get-or-create, mpi-operator's shape).

One simulation is:

- an owner ConfigMap ``rankpack-<sim>`` holding the spec (in pod mode also the launcher's
  key, instructions and hostfile, `keyed`); every other
  object names it in ``ownerReferences``, so deleting it garbage-collects the rest;
- a headless Service ``rankpack-<sim>`` (the rank pods' subdomain);
- one Pod ``rankpack-<sim>-<rank>`` per rank: a CPU request (no limit unless asked),
  resizable in place without a restart, idling until mpirun starts the rank in it;
- in pod mode its launcher pod ``rankpack-<sim>-launcher`` (`launcher_pod`), which runs
  mpirun.

A rank pod and a rank-group pod (`grouppods`, decision 0012: one pod per simulation per
node) are both `idle_pod`s, told apart by their `IdlePodShape`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.api.config import (
    DEV_IMAGE,
    DEV_IMAGE_PREFIX,
    HostPathVolume,
    PodBounds,
    VolumeSource,
    bounded,
    mount_path,
)
from rankpack.backend.kubernetes.objects import keyed
from rankpack.backend.protocol import BackendError, RankResources, SimSpec

Obj = dict[str, Any]

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "rankpack"
SIM_LABEL = "rankpack.dev/sim"
RANK_LABEL = "rankpack.dev/rank"
ROLE_LABEL = "rankpack.dev/role"
CONTAINER = "rank"
LIVE_VOLUME = "rankpack-live"
"""The rank pod's own ``emptyDir`` for the shim's live records (``rank-<r>.rec``) and their
wait-mode word: never on the case volume (a shared volume does not keep mmap coherent
across nodes), never a host path in the rank pod; the node agent reads it through the
kubelet's pod directory (decision 0010)."""
LIVE_DIR = Path("/var/run/rankpack")
"""Where the rank container mounts it (``RANKPACK_SHIM_DIR``)."""
IDLE_COMMAND = ("/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done")
"""The rank container's entrypoint: idle (the launcher starts the rank into the container),
end at once on SIGTERM (a shell as pid 1 ignores signals it does not trap), and outlive a
``kill -9 -1`` of everything else in the container (`stop`)."""
GRACE_S = 2
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def owner_name(sim_id: str) -> str:
    return f"rankpack-{sim_id}"


def service_name(sim_id: str) -> str:
    return f"rankpack-{sim_id}"


def pod_name(sim_id: str, rank: int) -> str:
    return f"rankpack-{sim_id}-{rank}"


def is_pod_name(name: str) -> bool:
    """Whether ``name`` can name a pod that doubles as a hostname: a DNS label (lowercase
    letters, digits and '-', at most 63 characters)."""
    return bool(_DNS_LABEL.match(name)) and len(name) <= 63


def check_sim_id(sim_id: str, n_ranks: int) -> None:
    """Pod names double as hostnames: a DNS label (lowercase, ≤ 63 characters)."""
    if not is_pod_name(pod_name(sim_id, max(0, n_ranks - 1))):
        raise BackendError(
            f"simulation id '{sim_id}' cannot name pods (lowercase letters, digits and '-', "
            "pod names of at most 63 characters)"
        )


def sim_selector(sim_id: str) -> str:
    return f"{MANAGED_BY}={MANAGER},{SIM_LABEL}={sim_id}"


ALL_SIMS_SELECTOR = f"{MANAGED_BY}={MANAGER},{SIM_LABEL}"
OWNERS_SELECTOR = f"{MANAGED_BY}={MANAGER},{ROLE_LABEL}=owner"


def labels(spec: SimSpec, **extra: str) -> dict[str, str]:
    """The simulation's labels (its own first: ours win on a clash)."""
    return {**spec.labels, MANAGED_BY: MANAGER, SIM_LABEL: spec.sim_id, **extra}


@dataclass(frozen=True)
class OwnerRef:
    """The owner ConfigMap as dependents name it (its uid is known once it exists)."""

    name: str
    uid: str

    def reference(self) -> Obj:
        # no blockOwnerDeletion: setting it needs `update` on the owner's finalizers, which
        # the least-privilege Role does not grant; `release` waits for the pods instead.
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }


def spec_json(spec: SimSpec, image: str) -> str:
    """What the owner records of the simulation (for `list`/`adopt` and for people)."""
    data = {
        "sim_id": spec.sim_id,
        "case_dir": str(spec.case_dir),
        "command": list(spec.command),
        "ranks": [
            {"request_millis": r.request_millis, "limit_millis": r.limit_millis} for r in spec.ranks
        ],
        "log_path": str(spec.log_path),
        "mpi": spec.mpi,
        "shim": spec.shim is not None,
        "image": image,
        "volume": spec.volume,
    }
    if spec.rank_nodes:
        data["rank_nodes"] = list(spec.rank_nodes)
    return json.dumps(data, sort_keys=True)


def owner_configmap(
    spec: SimSpec, image: str, key: str | None = None, files: Mapping[str, str] | None = None
) -> Obj:
    """The owner: the spec and, for a launcher-pod simulation, the key that enters its rank
    pods (`keyed`) and ``files``, its launcher's instructions and hostfile (`keyed.
    launcher_volume`)."""
    data = {"spec.json": spec_json(spec, image)}
    if key is not None:
        data[keyed.KEY_ITEM] = key
    data.update(files or {})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": owner_name(spec.sim_id),
            "labels": labels(spec, **{ROLE_LABEL: "owner"}),
        },
        "data": data,
    }


def headless_service(spec: SimSpec, owner: OwnerRef) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(spec.sim_id),
            "labels": labels(spec),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {MANAGED_BY: MANAGER, SIM_LABEL: spec.sim_id},
            "publishNotReadyAddresses": True,
        },
    }


def cpu_quantity(millis: int) -> str:
    return f"{millis}m"


def resources(res: RankResources) -> Obj:
    out: Obj = {"requests": {"cpu": cpu_quantity(res.request_millis)}}
    if res.limit_millis is not None:
        out["limits"] = {"cpu": cpu_quantity(res.limit_millis)}
    return out


CONTAINER_SECURITY: Obj = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Every rank and launcher container's security context: what PodSecurity ``restricted``
asks for, but ``runAsNonRoot`` (`security_context`)."""


def is_dev_image(image: str) -> bool:
    return image.startswith(DEV_IMAGE_PREFIX)


def security_context(image: str) -> Obj:
    """`CONTAINER_SECURITY`, plus ``runAsNonRoot`` with a real image (its user rankpack,
    uid 1000): all PodSecurity ``restricted`` asks. Not with the dev cluster's host-usr
    image, which is the host's ``/usr`` and runs as root (its case directories are written
    by a controller running as root on the host)."""
    security: Obj = dict(CONTAINER_SECURITY)
    if image != DEV_IMAGE:
        security["runAsNonRoot"] = True
    return security


def volume_entry(volume: VolumeSource) -> Obj:
    if isinstance(volume, HostPathVolume):
        return {"name": "case", "hostPath": {"path": str(volume.path), "type": "Directory"}}
    return {"name": "case", "persistentVolumeClaim": {"claimName": volume.claim}}


def _bounded_rank(res: Obj, bounds: PodBounds | None, n: int) -> Obj:
    if bounds is None:
        return res
    return bounded(res, bounds.rank_memory_mib, bounds.rank_ephemeral_mib, n)


def case_mount(volume: VolumeSource, case_dir: Path) -> Obj:
    """The simulation's own run directory at its path, and nothing else of the volume (a
    ``subPath``): a rank or launcher pod runs the user's code and may not reach another
    simulation's directory, the case roots or what else the volume holds."""
    root = mount_path(volume)
    if case_dir == root or not case_dir.is_relative_to(root):
        return {"name": "case", "mountPath": str(root)}
    return {"name": "case", "mountPath": str(case_dir), "subPath": str(case_dir.relative_to(root))}


@dataclass(frozen=True)
class IdlePodShape:
    """What tells apart pods that idle until mpirun starts ranks in them (a rank pod, a
    group pod: `grouppods`); the rest of such a pod is `idle_pod`'s."""

    name: str
    """The pod's name and hostname."""
    labels: Mapping[str, str]
    resources: RankResources
    """The ``rank`` container's CPU."""
    node: str | None = None
    """The node it is placed on (a required `node_affinity`); None: the scheduler's choice."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[tuple[Obj, Obj], ...] = ()
    """Volumes of its own beside the case and live ones, each with its container mount."""
    bounds: PodBounds | None = None
    """Its memory and ephemeral storage per rank (None: none asked)."""
    n_ranks: int = 1
    command: tuple[str, ...] = IDLE_COMMAND
    """Its container's process: idle (mpirun's ranks are started through ``pods/exec``), or
    ``rankpack-rankd`` (entered by the simulation's key: `keyed`)."""


def rank_pod(
    spec: SimSpec,
    rank: int,
    owner: OwnerRef,
    volume: VolumeSource,
    image: str,
    service_account: str | None = None,
) -> Obj:
    """Rank ``rank``'s pod: the plan's request, the case volume at ``case_dir``'s path, and
    its own ``rankpack-live`` volume for the shim's records; ``service_account`` its identity
    (None: the namespace's default), never with a token mounted."""
    shape = IdlePodShape(
        name=pod_name(spec.sim_id, rank),
        labels=labels(spec, **{RANK_LABEL: str(rank)}),
        resources=spec.ranks[rank],
        node=spec.rank_nodes[rank] if spec.rank_nodes else None,
    )
    return idle_pod(spec, shape, owner, volume, image, service_account)


def pull_secrets(names: Sequence[str]) -> list[Obj]:
    """A pod's ``imagePullSecrets``: the Simulation's Secrets by name (the kubelet reads
    them; nothing of rankpack does, and the operator holds no right on Secrets)."""
    return [{"name": n} for n in names]


def idle_pod(
    spec: SimSpec,
    shape: IdlePodShape,
    owner: OwnerRef,
    volume: VolumeSource,
    image: str,
    service_account: str | None = None,
) -> Obj:
    """A pod of ``spec``'s that idles until mpirun starts ranks in it: one container
    `CONTAINER` (`IDLE_COMMAND`, the restricted `security_context`, its CPU resizable in
    place without a restart), the case volume at ``case_dir``'s path, its own `LIVE_VOLUME`,
    in the Service's subdomain, owned by ``owner``; ``service_account`` its identity (None:
    the namespace's default), never with a token mounted."""
    mounts: list[Obj] = [
        case_mount(volume, spec.case_dir),
        {"name": LIVE_VOLUME, "mountPath": str(LIVE_DIR)},
    ]
    # on the node's disk, not medium Memory: a tmpfs would be a mount made after the agent
    # started, which it sees only through mount propagation
    volumes: list[Obj] = [volume_entry(volume), {"name": LIVE_VOLUME, "emptyDir": {}}]
    for own, mount in shape.volumes:
        volumes.append(own)
        mounts.append(mount)
    if image == DEV_IMAGE:
        # the dev cluster's image is an empty root whose bin/lib link into the host's /usr
        mounts.append({"name": "host-usr", "mountPath": "/usr", "readOnly": True})
        volumes.append({"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}})
    container: Obj = {
        "name": CONTAINER,
        "image": image,
        "command": list(shape.command),
        "workingDir": str(spec.case_dir),
        "resources": _bounded_rank(resources(shape.resources), shape.bounds, shape.n_ranks),
        "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
        "volumeMounts": mounts,
        "securityContext": security_context(image),
    }
    if is_dev_image(image):
        container["imagePullPolicy"] = "Never"
    pod_spec: Obj = {
        "hostname": shape.name,
        "subdomain": service_name(spec.sim_id),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if spec.pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets(spec.pull_secrets)
    if spec.placement:
        pod_spec["nodeSelector"] = dict(spec.placement)
    if shape.node is not None:
        pod_spec["affinity"] = node_affinity(shape.node)
    metadata: Obj = {
        "name": shape.name,
        "labels": dict(shape.labels),
        "ownerReferences": [owner.reference()],
    }
    if shape.annotations:
        metadata["annotations"] = dict(shape.annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The well-known label of a node's name (the dev cluster's kubelets set it to their node's
name with ``--hostname-override``)."""


def node_affinity(node: str) -> Obj:
    """A rank pod's required node affinity to ``node`` (the controller's placement,
    `SimSpec.rank_nodes`): through the scheduler, unlike ``nodeName``, so its fit check
    still applies (a pod that does not fit stays Pending instead of failing OutOfcpu)."""
    term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}
    }  # fmt: skip


def resize_patch(res: RankResources) -> Obj:
    """The ``pods/resize`` strategic-merge patch of the rank container's CPU."""
    return {"spec": {"containers": [{"name": CONTAINER, "resources": resources(res)}]}}


def core_event(
    involved: Obj,
    event_type: str,
    reason: str,
    message: str,
    labels: Mapping[str, str],
    component: str,
    now_iso: str,
    reporting: tuple[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Obj:
    """A core/v1 Event on ``involved`` (an object reference): the one shape both the
    backend's Warnings on rank pods and the operator's Events on Simulations take. ``name``:
    its own (a POST retried after an answer was lost then gets 409, not a copy); else one
    the apiserver generates."""
    meta: Obj = {"labels": dict(labels)}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = f"{involved['name']}."
    if involved.get("namespace"):
        meta["namespace"] = involved["namespace"]
    if annotations:
        meta["annotations"] = dict(annotations)
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": meta,
        "involvedObject": involved,
        "type": event_type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "firstTimestamp": now_iso,
        "lastTimestamp": now_iso,
        "count": 1,
    }
    if reporting is not None:
        body["reportingComponent"], body["reportingInstance"] = reporting[0], reporting[1][:128]
    return body


def event(
    spec_sim_id: str,
    namespace: str,
    pod: str,
    pod_uid: str | None,
    reason: str,
    message: str,
    now_iso: str,
) -> Obj:
    """A Warning Event on a rank pod: what the apiserver or the backend refused or saw fail
    (the kubelet records its own resize events; a refused patch leaves no trace otherwise).
    The pod's namespace is named: the apiserver refuses a core/v1 Event outside ``default``
    whose involved object has none ("does not match event.namespace")."""
    involved: Obj = {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace}
    if pod_uid:
        involved["uid"] = pod_uid
    labels = {MANAGED_BY: MANAGER, SIM_LABEL: spec_sim_id}
    return core_event(involved, "Warning", reason, message, labels, "rankpack", now_iso)


# -- the launcher pod (pod mode) -------------------------------------------------------------

LAUNCHER_CONTAINER = "launcher"
LAUNCHER_ROLE = "launcher"
"""The launcher pod's `ROLE_LABEL` (it has no `RANK_LABEL`: no rank listing takes it for a
rank)."""
TERMINATION_LOG = "/dev/termination-log"
"""Where the launcher writes why it failed before mpirun ran (the container's
``state.terminated.message``)."""
POD_IP_ENV = "RANKPACK_POD_IP"
"""The launcher pod's own IP (downward API): mpirun's address must lie in Open MPI's
``*_tcp_if_include`` subnet too."""


def launcher_pod_name(sim_id: str) -> str:
    return f"rankpack-{sim_id}-launcher"


def check_launcher_name(sim_id: str) -> None:
    """The launcher pod's name must be a DNS label too (it is longer than a rank pod's)."""
    name = launcher_pod_name(sim_id)
    if not is_pod_name(name):
        raise BackendError(
            f"simulation id '{sim_id}' cannot name its launcher pod {name} (at most 63 "
            "characters: lowercase letters, digits and '-')"
        )
