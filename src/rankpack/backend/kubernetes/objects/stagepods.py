"""The staging pod: a Simulation's case staged with its user's rights only. Pure builders.

``rankpack-<sim>-stage`` runs ``rankpack-stage REQUEST`` (`rankpack.case.sandbox`) in the
Simulation's namespace and image, and nothing in it reaches beyond that Simulation:

- no ServiceAccount token (the rank pods' identity, which has no Role), no Service links;
- PodSecurity ``restricted``: non-root, no privilege escalation, every capability dropped,
  the runtime's seccomp profile, and a read-only root filesystem (``/tmp`` an
  ``emptyDir`` with a size limit, ``HOME`` there);
- two mounts of the run directories' volume: its own run directory read-write (a
  ``subPath``, at the path it has everywhere else) and, for a case path, the admin's case
  root it was admitted under read-only (a ``subPath`` too; a host directory for a host
  volume's root off the volume). Nothing else: not the operator's store, not another
  Simulation's directory;
- CPU, memory and ephemeral-storage requests and limits, and an active deadline: a
  hostile staging ends there, its node shared fairly meanwhile.

Its answer is its termination message (`rankpack.case.stagewire`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rankpack.backend.kubernetes.api.config import (
    DEV_IMAGE,
    HostPathVolume,
    StagingBounds,
    VolumeSource,
    mount_path,
)
from rankpack.backend.kubernetes.objects.builders import (
    CONTAINER_SECURITY,
    MANAGED_BY,
    MANAGER,
    ROLE_LABEL,
    SIM_LABEL,
    Obj,
    is_dev_image,
    volume_entry,
)
from rankpack.backend.kubernetes.objects.builders import (
    pull_secrets as secret_refs,
)
from rankpack.backend.protocol import BackendError

STAGING_ROLE = "staging"
"""The staging pod's `ROLE_LABEL` (no rank label: no rank listing takes it)."""
STAGE_CONTAINER = "stage"
STAGE_COMMAND = ("rankpack-stage",)
"""The sandbox's entry point in the image (`rankpack.case.sandbox.main`); the request is
its one argument. No shell."""
TMP_DIR = "/tmp"


def staging_pod_name(sim_id: str) -> str:
    return f"rankpack-{sim_id}-stage"


def staging_pod(
    sim_id: str,
    request: str,
    *,
    image: str,
    volume: VolumeSource,
    run_dir: Path,
    case_root: Path | None,
    bounds: StagingBounds,
    service_account: str | None = None,
    labels: Mapping[str, str] | None = None,
    placement: Mapping[str, str] | None = None,
    pull_secrets: Sequence[str] = (),
) -> Obj:
    """The staging pod of ``sim_id``: ``request`` (`stagewire.request_text`) staged into
    ``run_dir`` from a case below ``case_root`` (None: a tutorial of the image)."""
    if image == DEV_IMAGE:
        raise BackendError(
            f"the dev cluster's {DEV_IMAGE} holds no rankpack and runs as root: it cannot stage "
            "a case in a sandbox; give --image rankpack.local/rank:dev (after `rankpack "
            "dev-cluster up --operator`) or an image of your own with rankpack in it"
        )
    mounts, volumes = _mounts(volume, run_dir, case_root, bounds)
    limits = {"cpu": f"{bounds.cpu_limit_millis}m", "memory": bounds.memory,
              "ephemeral-storage": bounds.ephemeral}  # fmt: skip
    container: Obj = {
        "name": STAGE_CONTAINER,
        "image": image,
        "command": [*STAGE_COMMAND, request],
        "workingDir": TMP_DIR,
        "env": [
            {"name": "HOME", "value": TMP_DIR},
            {"name": "MPLCONFIGDIR", "value": TMP_DIR},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "resources": {
            "requests": {**limits, "cpu": f"{bounds.cpu_request_millis}m"},
            "limits": limits,
        },
        "volumeMounts": mounts,
        "securityContext": {
            **CONTAINER_SECURITY,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
        "terminationMessagePolicy": "File",
    }
    if is_dev_image(image):
        container["imagePullPolicy"] = "Never"
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": bounds.deadline_s,
        "terminationGracePeriodSeconds": 2,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if pull_secrets:
        pod_spec["imagePullSecrets"] = secret_refs(pull_secrets)
    if placement:
        pod_spec["nodeSelector"] = dict(placement)
    own = {**(labels or {}), MANAGED_BY: MANAGER, SIM_LABEL: sim_id, ROLE_LABEL: STAGING_ROLE}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": staging_pod_name(sim_id), "labels": own},
        "spec": pod_spec,
    }


def _mounts(
    volume: VolumeSource, run_dir: Path, case_root: Path | None, bounds: StagingBounds
) -> tuple[list[Obj], list[Obj]]:
    """The staging container's mounts and the pod's volumes: the run directory read-write,
    the case root read-only, its own ``/tmp``."""
    root = mount_path(volume)
    if not run_dir.is_relative_to(root) or run_dir == root:
        raise BackendError(f"the run directory {run_dir} is not inside the volume at {root}")
    mounts: list[Obj] = [
        {"name": "case", "mountPath": str(run_dir), "subPath": str(run_dir.relative_to(root))},
        {"name": "tmp", "mountPath": TMP_DIR},
    ]
    volumes: list[Obj] = [volume_entry(volume),
                          {"name": "tmp", "emptyDir": {"sizeLimit": bounds.tmp_size}}]  # fmt: skip
    if case_root is not None:
        if case_root.is_relative_to(root) and case_root != root:
            mounts.append({"name": "case", "mountPath": str(case_root), "readOnly": True,
                           "subPath": str(case_root.relative_to(root))})  # fmt: skip
        elif isinstance(volume, HostPathVolume):
            volumes.append({"name": "cases", "hostPath": {"path": str(case_root),
                                                          "type": "Directory"}})  # fmt: skip
            mounts.append({"name": "cases", "mountPath": str(case_root), "readOnly": True})
        else:
            raise BackendError(
                f"the case root {case_root} is not on the run directories' volume (at {root}): "
                "a staging pod could not mount it; put the case roots on that volume"
            )
    return mounts, volumes
