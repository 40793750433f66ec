"""A dev cluster of two nodes on this machine (`rankpack dev-cluster up --nodes 2`).

Both nodes Ready with their own share of the CPUs; a pod pinned to each node runs there,
sees only that node's CPUs and reaches the other over TCP by pod IP; a host path
``/var/lib/kubelet`` means the pod's own node's directory; `stop-node` kills every process
of that node's pods and the node goes NotReady while the other node's pods run on;
`start-node` brings it back empty and a new pod runs there; `down` leaves nothing.

The module takes the session's one-node cluster down and brings up its own; the next test
that needs the session's cluster brings that back (`DevCluster.ensure_up`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.devcluster import binaries, host, packages, processes
from rankpack.devcluster.layout import (
    HOST_USR_IMAGE,
    SYSTEM_CGROUP,
    Layout,
    NodeSpec,
    format_cpus,
)
from rankpack.devcluster.lifecycle import bringup, clusterstate, teardown
from tests.cli_runner import rankpack
from tests.k8s.conftest import DevCluster, down_leaves_nothing
from tests.k8s.pods import container_cgroup, delete_and_wait, wait_running

NODES = ("rankpack-node", "rankpack-node-1")
PORT = 7000
CGROUP = Path("/sys/fs/cgroup")
SERVER = f"""
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT}))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(("%s %s" % (socket.gethostname(), sorted(os.sched_getaffinity(0)))).encode())
    c.close()
"""
CLIENT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    print(s.recv(200).decode())
except OSError as exc:
    print("error", exc.errno, exc)
"""

LOOKUP = """
import socket, sys, time
t = time.monotonic()
try:
    socket.getaddrinfo(sys.argv[1], None)
except OSError:
    pass
print(time.monotonic() - t)
"""


@dataclass
class TwoNodes:
    session: DevCluster
    up_s: float
    specs: dict[str, NodeSpec]

    @property
    def state_dir(self) -> Path:
        return self.session.state_dir

    @property
    def layout(self) -> Layout:
        return Layout(self.state_dir)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.session.admin_api())

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        kubectl = binaries.bin_dir(binaries.KubeVersion.parse(binaries.DEFAULT_VERSION))
        proc = subprocess.run(
            [str(kubectl / "kubectl"), f"--kubeconfig={self.layout.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def exec(self, pod: str, *argv: str) -> str:
        return self.kubectl("exec", "-n", self.session.namespace, pod, "--", *argv).strip()

    def server(self, name: str, node: str) -> Any:
        """A pod pinned to `node` (nodeSelector, so the scheduler's fit check applies) that
        answers on PORT with its name and CPUs; the node's /var/lib/kubelet mounted as a
        DaemonSet's host path would be."""
        core = self.core()
        core.create_namespaced_pod(self.session.namespace, server_pod(name, node))
        return wait_running(core, name, self.session.namespace)

    def node(self, name: str) -> Any:
        return self.core().read_node(name)


def server_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rankpack-tests"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": HOST_USR_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/bin/python3", "-c", SERVER],
                    "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}},
                    "volumeMounts": [
                        {"name": "host-usr", "mountPath": "/usr", "readOnly": True},
                        {"name": "kubelet", "mountPath": "/host/kubelet", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}},
                {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet"}},
            ],
        },
    }


def ready_status(node: Any) -> str:
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    return str(ready[0].status) if ready else "missing"


def pod_pids(pod: Any) -> list[int]:
    """Every process of the pod (its sandbox and containers): its pod-level cgroup."""
    pod_dir = container_cgroup(pod).parent
    return sorted(host.cgroup_pids(pod_dir))


@pytest.fixture(scope="module")
def two_up(dev_cluster: DevCluster) -> Iterator[TwoNodes]:
    state_dir = dev_cluster.state_dir
    if clusterstate.running_components(Layout(state_dir)):
        report = teardown.down(state_dir)
        assert not report.leftovers, report.leftovers
    opts = dataclasses.replace(dev_cluster.options(), nodes=2)
    result = bringup.up(opts)
    print(f"\n2-node dev cluster Ready in {result.elapsed_s:.1f} s")
    specs = {s.name: s for s in Layout(state_dir).recorded_nodes()}
    dev_cluster.up_result = result
    try:
        yield TwoNodes(dev_cluster, result.elapsed_s, specs)
    finally:
        if clusterstate.running_components(Layout(state_dir)):
            report = teardown.down(state_dir)
            assert not report.leftovers, report.leftovers


def test_both_nodes_ready_with_their_share_of_the_cpus(two_up: TwoNodes) -> None:
    proc = rankpack("dev-cluster", "status", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert [n["name"] for n in status["nodes"]] == list(NODES)
    share = len(host.host_cpus()) // 2
    cpus: set[str] = set()
    for i, entry in enumerate(status["nodes"]):
        assert entry["ready"] is True and entry["stopped"] is False
        assert entry["allocatable_millis"] == share * 1000
        assert entry["cpu_count"] == share
        assert entry["pods_cgroup"] == f"{entry['name']}/kubepods"
        node = two_up.node(entry["name"])
        assert node.status.capacity["cpu"] == str(share)  # its kubelet sees its CPUs only
        addresses = {a.type: a.address for a in node.status.addresses}
        assert addresses["InternalIP"] == f"10.200.0.{i + 1}"
        assert node.status.daemon_endpoints.kubelet_endpoint.port == 10250 + 10 * i
        cpus.add(entry["cpus"])
        cpuset = (CGROUP / "cpuset" / entry["name"] / "cpuset.cpus").read_text().strip()
        assert cpuset == entry["cpus"]
    assert len(cpus) == 2  # disjoint shares
    assert two_up.up_s < 120


def test_the_cluster_daemons_run_in_their_own_cgroup_and_node_roots_hold_only_pods(
    two_up: TwoNodes,
) -> None:
    layout = two_up.layout
    daemons = clusterstate.running_components(layout)
    assert len(daemons) == len(layout.components())
    system = {int(p) for p in (CGROUP / "cpu" / SYSTEM_CGROUP / "cgroup.procs").read_text().split()}
    assert set(daemons.values()) <= system
    for name in NODES:
        root = CGROUP / "cpu" / name
        assert not (root / "cgroup.procs").read_text().split()  # nothing right in the root
        assert not host.cgroup_pids(root) & system


def test_a_pod_on_each_node_sees_its_cpus_and_reaches_the_other(two_up: TwoNodes) -> None:
    pods = {node: two_up.server(f"server-{i}", node) for i, node in enumerate(NODES)}
    for i, (node, pod) in enumerate(pods.items()):
        spec = two_up.specs[node]
        assert pod.spec.node_name == node
        assert pod.status.pod_ip.startswith(f"10.201.{i}.")
        cpuset = (container_cgroup(pod, CGROUP / "cpuset") / "cpuset.cpus").read_text().strip()
        assert cpuset == format_cpus(spec.cpus)
        seen = two_up.exec(pod.metadata.name, "python3", "-c",
                        "import os; print(sorted(os.sched_getaffinity(0)))")  # fmt: skip
        assert seen == str(list(spec.cpus))
        # a host path /var/lib/kubelet is this node's kubelet root, not another node's
        listed = two_up.exec(pod.metadata.name, "ls", "/host/kubelet/pods").split()
        assert pod.metadata.uid in listed
        others = [p.metadata.uid for n, p in pods.items() if n != node]
        assert not set(others) & set(listed)
        assert (two_up.layout.node(spec).kubelet_root / "pods" / pod.metadata.uid).is_dir()
    a, b = pods[NODES[0]], pods[NODES[1]]
    for src, dst in ((a, b), (b, a)):
        answer = two_up.exec(src.metadata.name, "python3", "-c", CLIENT, dst.status.pod_ip,
                          str(PORT))  # fmt: skip
        assert answer.startswith(dst.metadata.name), answer
        # no resolver off this machine: a name lookup (mpirun resolves its hostfile's pod
        # names) fails at once instead of waiting out an unreachable nameserver's timeouts
        resolv = two_up.exec(src.metadata.name, "cat", "/etc/resolv.conf").split("\n")
        servers = [line.split()[1] for line in resolv if line.startswith("nameserver")]
        assert all(ipaddress.ip_address(s).is_loopback for s in servers), resolv
        took = float(two_up.exec(src.metadata.name, "python3", "-c", LOOKUP, dst.metadata.name))
        assert took < 2.0, f"a lookup of {dst.metadata.name} took {took:.1f} s to fail"


def test_stop_node_kills_its_pods_and_the_node_goes_not_ready(two_up: TwoNodes) -> None:
    core = two_up.core()
    ns = two_up.session.namespace
    a = core.read_namespaced_pod("server-0", ns)
    b = core.read_namespaced_pod("server-1", ns)
    stopped, kept = pod_pids(b), pod_pids(a)
    assert stopped and kept
    socket = two_up.layout.node(two_up.specs[NODES[1]]).containerd_socket
    assert processes.shims_of(socket)

    t0 = time.monotonic()
    proc = rankpack("dev-cluster", "stop-node", NODES[1], "--json", timeout=240)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert set(stopped) <= set(json.loads(proc.stdout)["killed_pids"])
    assert not any(processes.running(p) for p in stopped)
    assert not host.cgroup_pids(CGROUP / "cpu" / NODES[1])  # nothing of its pods runs
    assert not processes.shims_of(socket)
    assert not host.link_exists(two_up.specs[NODES[1]].bridge)  # its pod network is down
    assert all(processes.running(p) for p in kept), "the other node's pods must run on"
    # the other node's pod gets an answer at once: no route (nothing leaves the machine)
    answer = two_up.exec("server-0", "python3", "-c", CLIENT, b.status.pod_ip, str(PORT))
    assert answer.startswith("error 113"), answer  # EHOSTUNREACH
    status = clusterstate.status(two_up.state_dir)
    entry = next(n for n in status["nodes"] if n["name"] == NODES[1])
    assert entry["stopped"] is True and entry["running"] is False

    deadline = time.monotonic() + 150
    while ready_status(two_up.node(NODES[1])) == "True":
        assert time.monotonic() < deadline, "the stopped node stayed Ready"
        time.sleep(1)
    print(f"\nstop-node took {took:.1f} s; NotReady {time.monotonic() - t0:.0f} s after it")
    assert ready_status(two_up.node(NODES[0])) == "True"


def test_start_node_brings_it_back_empty_and_a_new_pod_runs_there(two_up: TwoNodes) -> None:
    old = two_up.core().read_namespaced_pod("server-1", two_up.session.namespace)
    old_ids = {s.container_id.split("://", 1)[1] for s in old.status.container_statuses or []}
    proc = rankpack("dev-cluster", "start-node", NODES[1], "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    print(f"\nstart-node: Ready in {json.loads(proc.stdout)['elapsed_s']} s")
    assert ready_status(two_up.node(NODES[1])) == "True"
    spec = two_up.specs[NODES[1]]
    # its old containers' state is gone (a fresh containerd under a fresh runtime directory)
    socket = two_up.layout.node(spec).containerd_socket
    listed = subprocess.run(
        [packages.tool("ctr"), "--address", str(socket), "-n", "k8s.io", "containers", "ls", "-q"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    assert old_ids and not old_ids & set(listed)
    again = two_up.core().read_namespaced_pod("server-1", two_up.session.namespace)
    print(
        f"the old pod on the returned node: {again.status.phase}, "
        f"{[(s.state, s.restart_count) for s in again.status.container_statuses or []]}"
    )

    delete_and_wait(two_up.core(), "server-1", two_up.session.namespace)
    pod = two_up.server("server-1b", NODES[1])
    assert pod.spec.node_name == NODES[1]
    cpuset = (container_cgroup(pod, CGROUP / "cpuset") / "cpuset.cpus").read_text().strip()
    assert cpuset == format_cpus(spec.cpus)
    answer = two_up.exec("server-0", "python3", "-c", CLIENT, pod.status.pod_ip, str(PORT))
    assert answer.startswith("server-1b"), answer


def test_down_leaves_nothing_with_pods_on_both_nodes(two_up: TwoNodes) -> None:
    core = two_up.core()
    ns = two_up.session.namespace
    pids = [p for name in ("server-0", "server-1b")
            for p in pod_pids(core.read_namespaced_pod(name, ns))]  # fmt: skip
    assert pids
    down_leaves_nothing(two_up.state_dir, two_up.session.before, two_up.session.links_before, pids)
    assert not os.path.exists(two_up.layout.nodes_file)
