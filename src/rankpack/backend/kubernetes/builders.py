"""Pure builders: a simulation's spec in, the Kubernetes objects and the mpirun command out.

No I/O and no client objects: every function returns plain JSON-like dicts (or argv lists)
and is table-tested (``tests/unit/kubernetes/test_builders.py``). `KubernetesBackend`
creates what these return (get-or-create, mpi-operator's shape).

One simulation is:

- an owner ConfigMap ``rankpack-<sim>`` holding the hostfile and the spec; every other
  object names it in ``ownerReferences``, so deleting it garbage-collects the rest;
- a headless Service ``rankpack-<sim>`` (the rank pods' subdomain);
- one Pod ``rankpack-<sim>-<rank>`` per rank: a CPU request (no limit unless asked),
  resizable in place without a restart, idling until the launcher starts the rank in it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.config import (
    DEV_IMAGE,
    DEV_IMAGE_PREFIX,
    HostPathVolume,
    VolumeSource,
    mount_path,
)
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


def check_sim_id(sim_id: str, n_ranks: int) -> None:
    """Pod names double as hostnames: a DNS label (lowercase, ≤ 63 characters)."""
    longest = pod_name(sim_id, max(0, n_ranks - 1))
    if not _DNS_LABEL.match(longest) or len(longest) > 63:
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


def hostfile(sim_id: str, n_ranks: int) -> str:
    """One line per rank pod in rank order (deterministic: sorted by rank, not by name)."""
    return "".join(f"{pod_name(sim_id, i)} slots=1\n" for i in range(n_ranks))


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
    return json.dumps(data, sort_keys=True)


def owner_configmap(spec: SimSpec, image: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": owner_name(spec.sim_id),
            "labels": labels(spec, **{ROLE_LABEL: "owner"}),
        },
        "data": {
            "hostfile": hostfile(spec.sim_id, len(spec.ranks)),
            "spec.json": spec_json(spec, image),
        },
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
"""Every rank container's security context: what PodSecurity ``restricted`` asks for, but
``runAsNonRoot``, which needs the real image's non-root user (the dev image is the host's
``/usr``; its case volume is written by the operator as root)."""


def is_dev_image(image: str) -> bool:
    return image.startswith(DEV_IMAGE_PREFIX)


def volume_entry(volume: VolumeSource) -> Obj:
    if isinstance(volume, HostPathVolume):
        return {"name": "case", "hostPath": {"path": str(volume.path), "type": "Directory"}}
    return {"name": "case", "persistentVolumeClaim": {"claimName": volume.claim}}


def rank_pod(spec: SimSpec, rank: int, owner: OwnerRef, volume: VolumeSource, image: str) -> Obj:
    """Rank ``rank``'s pod: the plan's request, the case volume at ``case_dir``'s path, and
    its own ``rankpack-live`` volume for the shim's records."""
    name = pod_name(spec.sim_id, rank)
    mounts: list[Obj] = [
        {"name": "case", "mountPath": str(mount_path(volume))},
        {"name": LIVE_VOLUME, "mountPath": str(LIVE_DIR)},
    ]
    # on the node's disk, not medium Memory: a tmpfs would be a mount made after the agent
    # started, which it sees only through mount propagation
    volumes: list[Obj] = [volume_entry(volume), {"name": LIVE_VOLUME, "emptyDir": {}}]
    if image == DEV_IMAGE:
        # the dev cluster's image is an empty root whose bin/lib link into the host's /usr
        mounts.append({"name": "host-usr", "mountPath": "/usr", "readOnly": True})
        volumes.append({"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}})
    container: Obj = {
        "name": CONTAINER,
        "image": image,
        "command": list(IDLE_COMMAND),
        "workingDir": str(spec.case_dir),
        "resources": resources(spec.ranks[rank]),
        "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
        "volumeMounts": mounts,
        "securityContext": CONTAINER_SECURITY,
    }
    if is_dev_image(image):
        container["imagePullPolicy"] = "Never"
    pod_spec: Obj = {
        "hostname": name,
        "subdomain": service_name(spec.sim_id),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    if spec.placement:
        pod_spec["nodeSelector"] = dict(spec.placement)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels(spec, **{RANK_LABEL: str(rank)}),
            "ownerReferences": [owner.reference()],
        },
        "spec": pod_spec,
    }


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
) -> Obj:
    """A core/v1 Event on ``involved`` (an object reference): the one shape both the
    backend's Warnings on rank pods and the operator's Events on Simulations take."""
    meta: Obj = {"generateName": f"{involved['name']}.", "labels": dict(labels)}
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
    spec_sim_id: str, pod: str, pod_uid: str | None, reason: str, message: str, now_iso: str
) -> Obj:
    """A Warning Event on a rank pod: what the apiserver or the backend refused or saw fail
    (the kubelet records its own resize events; a refused patch leaves no trace otherwise)."""
    involved: Obj = {"apiVersion": "v1", "kind": "Pod", "name": pod}
    if pod_uid:
        involved["uid"] = pod_uid
    labels = {MANAGED_BY: MANAGER, SIM_LABEL: spec_sim_id}
    return core_event(involved, "Warning", reason, message, labels, "rankpack", now_iso)


# -- the launcher ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MpirunArgs:
    mpirun: str
    n_ranks: int
    hostfile: Path
    agent: Path
    """The rsh agent: must exist at this path inside the pods too (orted segfaults else)."""
    case_dir: Path
    command: Sequence[str]
    env: Mapping[str, str]
    """Set in every rank (``-x NAME=VALUE``), not in mpirun's own environment."""
    subnet: str | None = None
    as_root: bool = False


def mpirun_argv(args: MpirunArgs) -> list[str]:
    """Open MPI's mpirun on the controller's host, ranks started in the pods via the agent."""
    if any(c.isspace() for c in str(args.agent)):
        raise BackendError(f"the rsh agent path {args.agent} contains whitespace")
    argv = [
        args.mpirun, "-np", str(args.n_ranks), "--hostfile", str(args.hostfile),
        "--map-by", "slot", "--bind-to", "none", "--wdir", str(args.case_dir),
        "--mca", "plm_rsh_agent", str(args.agent),
        "--mca", "plm_rsh_no_tree_spawn", "1",
        "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
    ]  # fmt: skip
    if args.subnet:
        argv += ["--mca", "oob_tcp_if_include", args.subnet]
        argv += ["--mca", "btl_tcp_if_include", args.subnet]
    if args.as_root:
        argv.append("--allow-run-as-root")
    for name in sorted(args.env):
        argv += ["-x", f"{name}={args.env[name]}"]
    return [*argv, *args.command]
