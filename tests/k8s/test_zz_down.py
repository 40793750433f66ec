"""`down` leaves nothing behind. Runs last in the tier (file order); later tests would
bring the cluster back up through the `k8s` fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rankpack.devcluster import host, processes
from rankpack.devcluster.layout import BRIDGE, HOST_PATHS, NODE_IP, SYSCTLS
from tests.k8s.conftest import DevCluster
from tests.k8s.pods import container_cgroup, sleeper_pod, wait_running

CLUSTER_EXES = {
    "etcd",
    "containerd",
    "containerd-shim-runc-v2",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "pause",
}


def test_down_leaves_no_process_mount_cgroup_address_or_path(k8s: DevCluster) -> None:
    from kubernetes import client

    # A running pod, so that there are containers, shims, a netns and veths to clean up.
    core = client.CoreV1Api(k8s.backend_api())
    core.create_namespaced_pod(k8s.namespace, sleeper_pod("left-running", 100))
    pod = wait_running(core, "left-running", k8s.namespace)
    pod_pids = [int(p) for p in (container_cgroup(pod) / "cgroup.procs").read_text().split()]
    assert pod_pids
    assert host.node_address_present() and host.link_exists(BRIDGE)

    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "down", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["leftovers"] == []
    assert report["stopped_pids"]

    # Checked here on our own, not trusting the report:
    state = str(k8s.state_dir)
    for pid in processes.all_pids():
        argv = processes.cmdline(pid)
        if not argv or not processes.running(pid):
            continue
        assert os.path.basename(argv[0]) not in CLUSTER_EXES, (pid, argv)
        assert not any(state in a for a in argv), (pid, argv)
    assert not any(processes.running(p) for p in pod_pids)
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    for prefix in (state, "/var/lib/kubelet", "/run/containerd", "/run/netns"):
        assert f" {prefix}/" not in mounts and f" {prefix} " not in mounts, prefix
    assert not list(Path("/sys/fs/cgroup").glob("*/kubepods")), "kubepods cgroups left"
    assert not Path("/sys/fs/cgroup/kubepods").exists()
    assert not host.node_address_present(), f"{NODE_IP} still on lo"
    assert not host.link_exists(BRIDGE)
    assert set(os.listdir("/sys/class/net")) <= k8s.links_before, "veth/bridge devices left"
    for name in SYSCTLS:
        assert host.read_sysctl(name) == k8s.before["sysctls"][name], name
    for path in HOST_PATHS:
        if path not in k8s.before["existing_paths"]:
            assert not os.path.lexists(path), path
    # The logs survive for a post-mortem; nothing else of the state does.
    assert sorted(p.name for p in k8s.state_dir.iterdir()) == ["logs"]

    again = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "down"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_a_failed_up_names_the_log_and_leaves_nothing(k8s_down: DevCluster) -> None:
    """A start that cannot finish (here: a 0.05 s budget per phase) is taken down again."""
    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "up", "--timeout", "0.05"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0, err
    assert "timed out" in err and "/logs" in err, err
    assert "taking down what was started" in proc.stdout
    from rankpack.devcluster import cluster

    layout = cluster.Layout(k8s_down.state_dir)
    assert cluster.running_components(layout) == {}
    assert cluster.leftovers(layout, k8s_down.before) == []
    assert not list(Path("/sys/fs/cgroup").glob("*/kubepods"))
    assert not host.node_address_present()
