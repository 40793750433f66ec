"""`rankpack dev-cluster up --operator`: rankpack in the dev cluster as a cluster runs it.

After `lifecycle.bringup.up`, builds (or reuses) the images from this checkout
(`appimages`), imports them into the cluster's containerd, creates the host directory
behind ``deploy/dev``'s PersistentVolume (owned by the images' non-root user), applies
``deploy/dev`` with ``kubectl apply -k`` as the admin, and waits (bounded) until the
operator's Deployment is available and the node agent's DaemonSet is ready on every node.
Nothing here is a special case of the manifests: the dev overlay changes only the images
and the volume.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.devcluster import appimages
from rankpack.devcluster.binaries import KubeVersion, bin_dir
from rankpack.devcluster.layout import NAMESPACE, Layout
from rankpack.errors import UserError
from rankpack.operator import manifests


@dataclass(frozen=True)
class Deployed:
    images: appimages.ImageSet
    runs_dir: Path
    elapsed_s: float

    def as_json(self) -> dict[str, Any]:
        return {**self.images.as_json(), "runs_dir": str(self.runs_dir),
                "elapsed_s": round(self.elapsed_s, 2)}  # fmt: skip


def source_root() -> Path:
    """The checkout (images/ and deploy/ live there; `appimages.find_source_root`)."""
    root = appimages.find_source_root()
    if not (root / "deploy" / "dev" / "kustomization.yaml").is_file():
        raise UserError(
            f"`dev-cluster up --operator` needs deploy/dev in the rankpack checkout {root}; "
            "run it from a complete checkout"
        )
    return root


def kubectl(layout: Layout, version: KubeVersion, args: list[str], timeout_s: float) -> str:
    """kubectl as the admin; a failure is a one-line UserError naming what it said."""
    argv = [str(bin_dir(version) / "kubectl"), f"--kubeconfig={layout.admin_kubeconfig}", *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"kubectl {' '.join(args[:3])} took over {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
        raise UserError(f"kubectl {' '.join(args[:3])} failed: {last}")
    return proc.stdout


def _rollout_done(obj: dict[str, Any]) -> bool:
    st = obj.get("status", {})
    if obj.get("kind") == "Deployment":
        want = obj.get("spec", {}).get("replicas", 1)
        return bool(
            st.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
            and st.get("updatedReplicas", 0) == want
            and st.get("availableReplicas", 0) == want
        )
    desired = st.get("desiredNumberScheduled", 0)
    return bool(
        desired > 0
        and st.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
        and st.get("updatedNumberScheduled", 0) == desired
        and st.get("numberReady", 0) == desired
    )


def wait_rolled_out(
    layout: Layout, version: KubeVersion, kinds: list[str], timeout_s: float
) -> None:
    """Every rankpack Deployment and DaemonSet (``rankpack``, ``rankpack-system``) rolled out
    and ready."""
    deadline = time.monotonic() + timeout_s
    selector = "app.kubernetes.io/managed-by=rankpack"
    pending: list[str] = []
    while time.monotonic() < deadline:
        out = kubectl(layout, version, ["get", ",".join(kinds), "--all-namespaces", "-l",
                                        selector, "-o", "json"], 30)  # fmt: skip
        items = json.loads(out).get("items", [])
        pending = [f"{o['kind']} {o['metadata']['name']}" for o in items if not _rollout_done(o)]
        if items and not pending:
            return
        time.sleep(1)
    raise UserError(
        f"not ready after {timeout_s:.0f} s: {', '.join(pending) or 'nothing deployed'}; see "
        f"`kubectl get pods -A -l app.kubernetes.io/managed-by=rankpack` and their logs"
    )


def runs_dir() -> Path:
    """The host directory behind ``deploy/dev``'s volumes (the operator's, and below it the
    ``rankpack`` namespace's), owned by the images' user."""
    path = Path(manifests.DEV_RUNS_DIR)
    tenant = path / "namespaces" / NAMESPACE
    tenant.mkdir(parents=True, exist_ok=True)
    for made in (path, path / "namespaces", tenant):
        os.chown(made, manifests.RUN_AS, manifests.RUN_AS)
        made.chmod(0o755)
    return path


def deploy(
    layout: Layout,
    version: KubeVersion,
    timeout_s: float,
    say: Callable[[str], None] = print,
    overlay: str = "dev",
) -> Deployed:
    """Images built and loaded, ``deploy/<overlay>`` applied (``dev``; ``dev-tenants``: the
    operator serving two namespaces), everything rolled out."""
    started = time.monotonic()
    root = source_root()
    images = appimages.ensure_images(root, say=say)
    rebuilt = any(i.image_built for i in images.images)
    say("rankpack: importing the images into the cluster's containerd")
    appimages.import_images(images, layout)
    runs = runs_dir()
    say(f"rankpack: applying {root / 'deploy' / overlay} (run directories in {runs})")
    kubectl(layout, version, ["apply", "-k", str(root / "deploy" / overlay)], 120)
    if rebuilt:
        # the tags stay `dev`: pods made from an earlier build restart on the new one
        for kind in ("deployment", "daemonset"):
            kubectl(layout, version, ["rollout", "restart", kind, "-n",
                                      manifests.SYSTEM_NAMESPACE, "-l",
                                      "app.kubernetes.io/managed-by=rankpack"], 60)  # fmt: skip
    wait_rolled_out(layout, version, ["deployments", "daemonsets"], timeout_s)
    return Deployed(images, runs, time.monotonic() - started)
