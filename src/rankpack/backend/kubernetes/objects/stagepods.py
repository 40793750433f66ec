"""The staging pod: a Simulation's case staged with its user's rights only. Pure builders.

``rankpack-<sim>-stage`` runs in the Simulation's namespace, three containers sharing the
Simulation's run directory, and nothing in it reaches beyond that Simulation:

- init `TOOLS_CONTAINER`, rankpack's image (the operator's ``--image``):
  ``rankpack-stage --install-tools``, the static tools binary, a new key and the hosts
  file into the pod's own `TOOLS_DIR` (`foamexec.install`);
- init `OPENFOAM_CONTAINER`, a native sidecar (``restartPolicy: Always``: up before the
  main container starts, ended after it), the Simulation's image: ``rankpack-tools rankd
  KEY --loopback`` from `TOOLS_DIR`, which runs the OpenFOAM commands staging sends, on
  the pod's loopback only;
- `STAGE_CONTAINER`, rankpack's image: ``rankpack-stage --tools DIR REQUEST``
  (`rankpack.case.sandbox`): copy, confine, parse, decompose (pymetis), every OpenFOAM
  command sent to the sidecar with ``rankpack-exec`` (`foamexec`).

So nothing of rankpack's Python runs in the Simulation's image, and the image needs no
rankpack. Every container:

- no ServiceAccount token (the rank pods' identity, which has no Role), no Service links;
- PodSecurity ``restricted``: non-root, no privilege escalation, every capability dropped,
  the runtime's seccomp profile, and a read-only root filesystem (``/tmp`` an ``emptyDir``
  of its own with a size limit, ``HOME`` there);
- of the run directories' volume, the sidecar and the main container mount their own run
  directory read-write (a ``subPath``, at the path it has everywhere else) and, the main
  container alone, for a case path, the admin's case root it was admitted under read-only
  (a ``subPath`` too; a host directory for a host volume's root off the volume). Nothing
  else: not the operator's store, not another Simulation's directory. `TOOLS_DIR` is
  written by the init container only, read-only to the others;
- CPU, memory and ephemeral-storage limits each (`StagingBounds`: the sidecar and the main
  container each as much as staging had in one container), requests that add up to the
  pod's, and the pod's active deadline: a hostile staging ends there, its node shared
  fairly meanwhile.

Its answer is its main container's termination message (`rankpack.case.stagewire`).
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
from rankpack.case import foamexec

STAGING_ROLE = "staging"
"""The staging pod's `ROLE_LABEL` (no rank label: no rank listing takes it)."""
STAGE_CONTAINER = "stage"
TOOLS_CONTAINER = "tools"
OPENFOAM_CONTAINER = "openfoam"
STAGE_COMMAND = ("rankpack-stage",)
"""The sandbox's entry point in rankpack's image (`rankpack.case.sandbox.main`); the
request is its last argument. No shell."""
TOOLS_DIR = Path("/rankpack/tools")
"""The pod's own volume of tools (an ``emptyDir``): `foamexec.install`'s files."""
TOOLS_VOLUME = "rankpack-tools"
TOOLS_SIZE = "64Mi"
TOOLS_RESOURCES: Obj = {
    "requests": {"cpu": "50m", "memory": "64Mi", "ephemeral-storage": "16Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "64Mi"},
}
"""The init container's: it copies one file of 3 MB and writes two small ones."""
TMP_DIR = "/tmp"
PYTHON_ENV: list[Obj] = [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}]


def staging_pod_name(sim_id: str) -> str:
    return f"rankpack-{sim_id}-stage"


def staging_pod(
    sim_id: str,
    request: str,
    *,
    image: str,
    tools_image: str,
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
    ``run_dir`` from a case below ``case_root`` (None: a tutorial of the image) by
    rankpack's ``tools_image``, with the OpenFOAM of the Simulation's ``image``."""
    if DEV_IMAGE in (image, tools_image):
        raise BackendError(
            f"the dev cluster's {DEV_IMAGE} holds no rankpack and runs as root: a staging pod "
            "can neither stage with it nor run a case's OpenFOAM in it sandboxed; give the "
            "operator --image rankpack.local/rank:dev (after `rankpack dev-cluster up "
            "--operator`), and Simulations an image of their own"
        )
    run_mount, root_mounts, volumes = _mounts(volume, run_dir, case_root, bounds)
    tools = {"name": TOOLS_VOLUME, "mountPath": str(TOOLS_DIR), "readOnly": True}
    volumes.append({"name": TOOLS_VOLUME, "emptyDir": {"sizeLimit": TOOLS_SIZE}})
    prepare = _container(TOOLS_CONTAINER, tools_image,
                         [*STAGE_COMMAND, "--install-tools", str(TOOLS_DIR)],
                         [{"name": TOOLS_VOLUME, "mountPath": str(TOOLS_DIR)}],
                         TOOLS_RESOURCES, PYTHON_ENV)  # fmt: skip
    binary = str(TOOLS_DIR / foamexec.BINARY)
    openfoam = _container(
        OPENFOAM_CONTAINER, image, [binary, "rankd", str(TOOLS_DIR / foamexec.KEY_FILE),
                                    "--loopback"],
        [run_mount, tools, {"name": "openfoam-tmp", "mountPath": TMP_DIR}], _share(bounds),
        [{"name": "HOME", "value": TMP_DIR}],
    )  # fmt: skip
    openfoam["restartPolicy"] = "Always"  # a native sidecar: up before, ended after the stage
    stage = _container(STAGE_CONTAINER, tools_image,
                       [*STAGE_COMMAND, "--tools", str(TOOLS_DIR), request],
                       [run_mount, *root_mounts, tools, {"name": "tmp", "mountPath": TMP_DIR}],
                       _share(bounds), [{"name": "HOME", "value": TMP_DIR},
                                        {"name": "MPLCONFIGDIR", "value": TMP_DIR},
                                        *PYTHON_ENV])  # fmt: skip
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": bounds.deadline_s,
        "terminationGracePeriodSeconds": 2,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "initContainers": [prepare, openfoam],
        "containers": [stage],
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


def _container(name: str, image: str, command: list[str], mounts: list[Obj],
               resources: Obj, env: list[Obj]) -> Obj:  # fmt: skip
    """One of the staging pod's containers: restricted, a read-only root, its answer or
    its failure in its termination message."""
    found: Obj = {
        "name": name,
        "image": image,
        "command": command,
        "workingDir": TMP_DIR,
        "env": env,
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {
            **CONTAINER_SECURITY,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
        "terminationMessagePolicy": "File",
    }
    if is_dev_image(image):
        found["imagePullPolicy"] = "Never"
    return found


def _share(bounds: StagingBounds) -> Obj:
    """The sidecar's and the main container's resources: each the limits staging has, the
    requests halved (the pod requests what one staging container did)."""
    limits = {"cpu": f"{bounds.cpu_limit_millis}m", "memory": f"{bounds.memory_mib}Mi",
              "ephemeral-storage": f"{bounds.ephemeral_mib}Mi"}  # fmt: skip
    requests = {"cpu": f"{max(1, bounds.cpu_request_millis // 2)}m",
                "memory": f"{bounds.memory_mib // 2}Mi",
                "ephemeral-storage": f"{bounds.ephemeral_mib // 2}Mi"}  # fmt: skip
    return {"requests": requests, "limits": limits}


def _mounts(
    volume: VolumeSource, run_dir: Path, case_root: Path | None, bounds: StagingBounds
) -> tuple[Obj, list[Obj], list[Obj]]:
    """The run directory's mount (read-write), the case root's (read-only; the main
    container's alone), and the pod's volumes but the tools': the run directories', and a
    ``/tmp`` of its own for the main container and for the sidecar."""
    root = mount_path(volume)
    if not run_dir.is_relative_to(root) or run_dir == root:
        raise BackendError(f"the run directory {run_dir} is not inside the volume at {root}")
    run_mount = {"name": "case", "mountPath": str(run_dir),
                 "subPath": str(run_dir.relative_to(root))}  # fmt: skip
    mounts: list[Obj] = []
    tmp = {"sizeLimit": bounds.tmp_size}
    volumes: list[Obj] = [volume_entry(volume), {"name": "tmp", "emptyDir": tmp},
                          {"name": "openfoam-tmp", "emptyDir": dict(tmp)}]  # fmt: skip
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
    return run_mount, mounts, volumes
