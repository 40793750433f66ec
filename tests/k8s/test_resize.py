"""In-place resize through `pods/resize`, seen in the container's own cgroup."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.k8s.conftest import DevCluster
from tests.k8s.pods import container_cgroup, cpu_patch, delete_and_wait, sleeper_pod, wait_running


def shares_for(millis: int) -> int:
    return max(2, millis * 1024 // 1000)  # the kubelet's mapping (helpers_linux.go)


def read_int(path: Path) -> int:
    return int(path.read_text().strip())


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

        patch = cpu_patch("main", "1200m")
        started = time.monotonic()
        core.patch_namespaced_pod_resize(
            name, ns, patch, _content_type="application/strategic-merge-patch+json"
        )
        want = shares_for(1200)
        deadline = started + 30
        while read_int(cgroup / "cpu.shares") != want and time.monotonic() < deadline:
            time.sleep(0.01)
        latency_s = time.monotonic() - started
        print(f"\nresize 500m -> 1200m reached cpu.shares={want} in {latency_s:.3f} s")
        record_property("resize_latency_s", round(latency_s, 4))
        assert read_int(cgroup / "cpu.shares") == want, f"cpu.shares unchanged after {latency_s}"

        # Same container, same process, no restart; the pod status follows.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pod = core.read_namespaced_pod(name, ns)
            st = pod.status.container_statuses[0]
            if st.resources and st.resources.requests.get("cpu") == "1200m":
                break
            time.sleep(0.2)
        assert st.container_id == status.container_id
        assert st.restart_count == 0
        assert st.resources.requests["cpu"] == "1200m"
        assert pod.spec.containers[0].resources.requests["cpu"] == "1200m"
        assert cgroup.joinpath("cgroup.procs").read_text().split() == pids_before
        # The pod-level cgroup weighs the new request too.
        assert read_int(cgroup.parent / "cpu.shares") >= want
    finally:
        delete_and_wait(core, name, ns)
