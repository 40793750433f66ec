"""In-place resize through `pods/resize`, seen in the container's own cgroup."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.k8s.conftest import DevCluster
from tests.k8s.pods import (
    container_cgroup,
    cpu_patch,
    delete_and_wait,
    shares_for,
    sleeper_pod,
    wait_running,
)


def read_int(path: Path) -> int:
    return int(path.read_text().strip())


def resize_and_wait(core: Any, name: str, ns: str, cgroup: Path, millis: int) -> float:
    """Patch `pods/resize`; seconds until the container cgroup's cpu.shares shows it."""
    started = time.monotonic()
    core.patch_namespaced_pod_resize(
        name,
        ns,
        cpu_patch("main", f"{millis}m"),
        _content_type="application/strategic-merge-patch+json",
    )
    want, deadline = shares_for(millis), started + 30
    while read_int(cgroup / "cpu.shares") != want and time.monotonic() < deadline:
        time.sleep(0.01)
    latency_s = time.monotonic() - started
    assert read_int(cgroup / "cpu.shares") == want, f"cpu.shares unchanged after {latency_s} s"
    return latency_s


def test_cpu_request_resized_in_place(
    k8s: DevCluster, record_property: Callable[[str, object], None]
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(k8s.backend_api())  # the backend's ServiceAccount, not admin
    ns, name = k8s.namespace, "resize-sleeper"
    core.create_namespaced_pod(ns, sleeper_pod(name, 500))
    try:
        pod = wait_running(core, name, ns)
        status = pod.status.container_statuses[0]
        cgroup = container_cgroup(pod)
        assert read_int(cgroup / "cpu.shares") == shares_for(500)
        pids_before = cgroup.joinpath("cgroup.procs").read_text().split()
        assert pids_before, "the sleep process is in its container's cgroup"

        # Up, down, up again: each change must reach the container's own cgroup.
        latencies = []
        for before, after in ((500, 1200), (1200, 300), (300, 900)):
            latencies.append(resize_and_wait(core, name, ns, cgroup, after))
            print(
                f"\nresize {before}m -> {after}m: cpu.shares={shares_for(after)} "
                f"after {latencies[-1]:.3f} s"
            )
        record_property("resize_latencies_s", [round(x, 4) for x in latencies])

        # Same container, same process, no restart; the pod status follows.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pod = core.read_namespaced_pod(name, ns)
            st = pod.status.container_statuses[0]
            if st.resources and st.resources.requests.get("cpu") == "900m":
                break
            time.sleep(0.2)
        assert st.container_id == status.container_id
        assert st.restart_count == 0
        assert st.resources.requests["cpu"] == "900m"
        assert pod.spec.containers[0].resources.requests["cpu"] == "900m"
        assert cgroup.joinpath("cgroup.procs").read_text().split() == pids_before
        # The pod-level cgroup weighs the new request too.
        assert read_int(cgroup.parent / "cpu.shares") >= shares_for(900)
    finally:
        delete_and_wait(core, name, ns)
