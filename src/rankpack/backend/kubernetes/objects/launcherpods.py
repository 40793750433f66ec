"""The launcher pod of a pod-mode simulation (decision 0008): `launcher_pod` and what it is
made of. Pure: a dict for the apiserver.

Its prepare container (rankpack's own image, the launcher's ServiceAccount token mounted
there alone) waits for the rank pods and writes what mpirun runs (`starting.launcher`); its
launcher container (the Simulation's own image, no token), started with it, runs
``rankpack-launch`` from the case volume (`keyed.TOOLS_DIR`, ``tools/launch``), which waits
for that and starts mpirun once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankpack.backend.kubernetes.api.config import DEV_IMAGE, PodBounds, VolumeSource, bounded
from rankpack.backend.kubernetes.objects import keyed
from rankpack.backend.kubernetes.objects.builders import (
    LAUNCHER_CONTAINER,
    LAUNCHER_ROLE,
    POD_IP_ENV,
    RANK_LABEL,
    ROLE_LABEL,
    TERMINATION_LOG,
    Obj,
    OwnerRef,
    case_mount,
    cpu_quantity,
    is_dev_image,
    labels,
    launcher_pod_name,
    pull_secrets,
    security_context,
    volume_entry,
)
from rankpack.backend.protocol import SimSpec

PREPARE_CONTAINER = "prepare"
CONTAINERS = (PREPARE_CONTAINER, LAUNCHER_CONTAINER)
"""The launcher pod's containers, each requesting its CPU (`LauncherOptions.cpu_millis`): what
the pod requests is that many times it (`nodes.capacity`)."""
LAUNCHER_COMMAND = ("rankpack-launcher",)
"""The launcher's prepare container's entry point in rankpack's image (`launcher.main`, on
PATH); the instructions file and `LAUNCH_DIR` are its arguments. No shell."""
LAUNCH_DIR = Path("/rankpack/launch")
"""The launcher pod's own volume (an emptyDir): its prepare container writes what
``rankpack-launch`` runs there (`LAUNCH_FILE`, and `HOSTS_FILE` for ``rankpack-exec``)."""
LAUNCH_FILE = "launch.json"
HOSTS_FILE = "hosts.json"
FAILED_FILE = "failed"
"""Written beside `LAUNCH_FILE` instead of it when the prepare container cannot write it (its
reason): ``rankpack-launch``, waiting for one of the two, then ends (tools/launch)."""
LAUNCH_VOLUME = "rankpack-launch"
TOKEN_VOLUME = "rankpack-token"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the in-cluster client reads the ServiceAccount's token, CA and namespace: mounted
in the launcher's prepare container alone (the pod does not automount its token)."""
TOKEN_TTL_S = 3600
LAUNCHER_CPU_MILLIS = 50
"""mpirun and the rsh agents mostly wait; a small request, no limit (it may burst). It is
counted on its node like any pod's (`capacity`), but is no rank's."""
LAUNCHER_GRACE_S = 10
"""SIGTERM reaches the launcher, which forwards it to mpirun, which takes its ranks down."""


@dataclass(frozen=True)
class LauncherOptions:
    """What a launcher pod needs besides the simulation's spec."""

    instructions: str
    """Its instructions (`instructions.Instructions`, JSON), kept in the owner ConfigMap and
    read by the launcher at `keyed.KEY_DIR`."""
    hostfile: str
    """mpirun's hostfile, kept beside them."""
    service_account: str
    """Its identity: may read pods (`rbac.LAUNCHER_RULES`), its token mounted in the init
    container alone."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment (e.g. ``KUBERNETES_SERVICE_HOST``/``_PORT`` where the apiserver's
    Service IP does not route from pods: a cluster without kube-proxy)."""
    cpu_millis: int = LAUNCHER_CPU_MILLIS
    """Its CPU request (no limit)."""
    rank_service_account: str | None = None
    """The rank pods' identity beside it (no rights; `rbac.RANK_SERVICE_ACCOUNT`)."""
    bounds: PodBounds | None = None
    """Its memory and ephemeral storage (None: none asked)."""
    tools_image: str | None = None
    """rankpack's own image, where the prepare container waits for the rank pods (None: the
    simulation's image)."""


def _launcher_resources(options: LauncherOptions) -> Obj:
    res: Obj = {"requests": {"cpu": cpu_quantity(options.cpu_millis)}}
    b = options.bounds
    return res if b is None else bounded(res, b.launcher_memory_mib, b.launcher_ephemeral_mib)


def token_volume() -> Obj:
    """The ServiceAccount's token, CA and namespace as the kubelet's automount gives them, as
    a volume one container mounts (`TOKEN_DIR`)."""
    return {"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_TTL_S}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [
            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}  # fmt: skip


def _container(
    spec: SimSpec,
    options: LauncherOptions,
    name: str,
    image: str,
    command: list[str],
    mounts: list[Obj],
) -> Obj:
    """One of the launcher pod's containers (the dev image gets the host's ``/usr``)."""
    host_usr = {"name": "host-usr", "mountPath": "/usr", "readOnly": True}
    found: Obj = {
        "name": name,
        "image": image,
        "command": command,
        "workingDir": str(spec.case_dir),
        "env": [
            {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *({"name": k, "value": v} for k, v in options.env if k != POD_IP_ENV),
        ],
        "resources": _launcher_resources(options),
        "volumeMounts": mounts + ([host_usr] if image == DEV_IMAGE else []),
        "securityContext": security_context(image),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
    }
    if is_dev_image(image):
        found["imagePullPolicy"] = "Never"
    return found


def launcher_pod(
    spec: SimSpec, owner: OwnerRef, volume: VolumeSource, image: str, options: LauncherOptions
) -> Obj:
    """The simulation's launcher pod: mpirun for its rank pods (decision 0008, pod mode).

    Two containers, started together, each with the rank pods' restricted security context
    (plus ``runAsNonRoot`` with a real image), the case volume at the same path as there and
    the owner's key, instructions and hostfile (`keyed.launcher_volume`):

    - `PREPARE_CONTAINER`: rankpack's own image (``options.tools_image``) and the
      ServiceAccount's token (to read pods), mounted here alone; it waits for the rank pods
      and writes what mpirun runs into `LAUNCH_DIR` (`launcher.main`), then ends;
    - the launcher container: the simulation's image (its own mpirun) and no token; it runs
      ``rankpack-launch`` from the case volume (`keyed.TOOLS_DIR`), which waits for that and
      starts mpirun once with ``rankpack-exec`` as its rsh agent.

    Not an init container and a container: the kubelet notices an init container's end at
    its next look at the node's containers (once a second), which every launch would wait
    for (issue 38). The containers share no process namespace: the launcher container
    cannot reach the token.

    A small CPU request each and no limit; it runs once (``restartPolicy: Never``)."""
    name = launcher_pod_name(spec.sim_id)
    tools_image = options.tools_image or image
    # the key it enters the rank pods with, its instructions, the hostfile: the owner's
    key, key_mount = keyed.launcher_volume(owner.name)
    launch_mount = {"name": LAUNCH_VOLUME, "mountPath": str(LAUNCH_DIR)}
    mounts: list[Obj] = [case_mount(volume, spec.case_dir), key_mount]
    volumes: list[Obj] = [volume_entry(volume), key, {"name": LAUNCH_VOLUME, "emptyDir": {}},
                          token_volume()]  # fmt: skip
    if DEV_IMAGE in (image, tools_image):
        volumes.append({"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}})

    token_mount = {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}
    prepare = _container(
        spec, options, PREPARE_CONTAINER, tools_image,
        [*LAUNCHER_COMMAND, str(keyed.KEY_DIR / keyed.LAUNCH_ITEM), str(LAUNCH_DIR)],
        [*mounts, launch_mount, token_mount],
    )  # fmt: skip
    launch = _container(
        spec, options, LAUNCHER_CONTAINER, image,
        [str(keyed.tool(spec.case_dir, keyed.LAUNCH)), str(LAUNCH_DIR / LAUNCH_FILE)],
        [*mounts, {**launch_mount, "readOnly": True}],
    )  # fmt: skip
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": LAUNCHER_GRACE_S,
        "enableServiceLinks": False,
        "serviceAccountName": options.service_account,
        "automountServiceAccountToken": False,
        "containers": [prepare, launch],
        "volumes": volumes,
    }
    if spec.pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets(spec.pull_secrets)
    if spec.placement:
        # where the rank pods may go is where the case volume and the image are
        pod_spec["nodeSelector"] = dict(spec.placement)
    own = labels(spec, **{ROLE_LABEL: LAUNCHER_ROLE})
    own.pop(RANK_LABEL, None)  # (a run's own labels cannot make it a rank)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": own,
            "annotations": {DEFAULT_CONTAINER: LAUNCHER_CONTAINER},  # what `kubectl logs` shows
            "ownerReferences": [owner.reference()],
        },
        "spec": pod_spec,
    }
