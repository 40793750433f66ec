"""Pods the k8s tier creates: a `sleep` on the host-usr image with a CPU request only."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rankpack.devcluster.layout import HOST_USR_IMAGE

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


def sleeper_pod(name: str, cpu_millis: int) -> dict[str, Any]:
    """Request, no limit, CPU resizable without a restart; the host's /usr mounted read-only."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rankpack-tests"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": HOST_USR_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/bin/sleep", "3600"],
                    "resources": {"requests": {"cpu": f"{cpu_millis}m", "memory": "16Mi"}},
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                    "volumeMounts": [{"name": "host-usr", "mountPath": "/usr", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}}],
        },
    }


def wait_running(core: Any, name: str, namespace: str, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    pod = None
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses
        if pod.status.phase == "Running" and statuses and statuses[0].state.running:
            return pod
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} ended: {pod.status}")
        time.sleep(0.2)
    raise AssertionError(f"pod {name} not Running after {timeout_s} s: {pod and pod.status}")


def container_cgroup(pod: Any, hierarchy: Path = CGROUP_CPU) -> Path:
    """cgroup v1 directory (cpu by default) of the pod's first container (burstable QoS:
    request only), below its node's cgroup root (``<node name>/kubepods``)."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    pods = hierarchy / pod.spec.node_name / "kubepods"
    return pods / "burstable" / f"pod{pod.metadata.uid}" / cid


def delete_and_wait(core: Any, name: str, namespace: str, timeout_s: float = 60) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.2)
    raise AssertionError(f"pod {name} still exists after {timeout_s} s")


def cpu_patch(container: str, cpu: str) -> dict[str, Any]:
    """A `pods/resize` strategic-merge patch of one container's CPU request."""
    return {"spec": {"containers": [{"name": container, "resources": {"requests": {"cpu": cpu}}}]}}


def shares_for(millis: int) -> int:
    """The cgroup v1 ``cpu.shares`` the kubelet writes for a request of ``millis``."""
    return max(2, millis * 1024 // 1000)


@contextmanager
def tenant_pod(core: Any, name: str, millis: int) -> Iterator[Callable[[], None]]:
    """Another tenant's pod requesting ``millis`` in ``default`` (a namespace the operator's
    identity cannot read), running; yields what deletes it (and waits until it is gone),
    which the exit does again if the test did not."""
    core.create_namespaced_pod("default", sleeper_pod(name, millis))

    def gone() -> None:
        delete_and_wait(core, name, "default")

    try:
        wait_running(core, name, "default")
        yield gone
    finally:
        gone()
