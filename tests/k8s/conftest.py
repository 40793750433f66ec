"""The `k8s` tier: a real single-node cluster (`rankpack dev-cluster`), up once per session.

(`test_nodes.py` takes it down for a module of its own on a 2-node cluster; the next test
that needs the session's cluster brings it up again: `DevCluster.ensure_up`.)

The session fixture takes down a cluster that is already up, records the host, brings the
dev cluster up with the cached binaries (`setup.sh test` builds them before pytest starts;
a cold build inside a test would exceed the per-test timeout) and, as its teardown, takes
it down with `rankpack dev-cluster down` and checks that nothing is left
(`DevCluster.take_down`). That teardown runs right after the last test that needs the
cluster (a test marked `k8s`: the tests here and the contract suite's Kubernetes param),
whatever the files are called, so that the tiers after it (peer, unit) do not share the
machine with a running cluster nor give it their short per-test timeout; at the latest at
the end of the session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rankpack.devcluster import binaries, host, processes
from rankpack.devcluster.layout import (
    BRIDGE,
    HOST_PATHS,
    NAMESPACE,
    NODE_BINDS,
    NODE_IP,
    SYSCTLS,
    SYSTEM_CGROUP,
    UNREACHABLE_ROUTES,
    Layout,
    default_state_dir,
)
from rankpack.devcluster.lifecycle import bringup, clusterstate, teardown
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


@dataclass
class DevCluster:
    state_dir: Path
    before: dict[str, Any]
    """host.record() taken before the session's `up`: what `down` must restore."""
    up_result: bringup.UpResult
    links_before: set[str]
    """Network devices present before the session's `up`."""
    taken_down: bool = field(default=False, init=False)

    def ensure_up(self) -> None:
        """Bring it (back) up if an earlier test took it down (or left another one up:
        the session's cluster has one node)."""
        st = clusterstate.status(self.state_dir)
        if st["ready"] and len(st["nodes"]) == 1:
            return
        if clusterstate.running_components(Layout(self.state_dir)):
            report = teardown.down(self.state_dir)
            assert not report.leftovers, report.leftovers
        self.up_result = bringup.up(self.options())

    @contextlib.contextmanager
    def nodes_up(self, nodes: int) -> Iterator[DevCluster]:
        """A cluster of ``nodes`` nodes in place of the session's (for a module: its tests'
        `up_result`), taken down after; the next test that needs the session's one-node
        cluster brings it back (`ensure_up`)."""
        if clusterstate.running_components(Layout(self.state_dir)):
            report = teardown.down(self.state_dir)
            assert not report.leftovers, report.leftovers
        self.up_result = bringup.up(dataclasses.replace(self.options(), nodes=nodes))
        try:
            yield self
        finally:
            if clusterstate.running_components(Layout(self.state_dir)):
                report = teardown.down(self.state_dir)
                assert not report.leftovers, report.leftovers

    def options(self) -> bringup.UpOptions:
        return bringup.UpOptions(
            version=binaries.KubeVersion.parse(binaries.DEFAULT_VERSION),
            state_dir=self.state_dir,
            ready_timeout_s=180,
        )

    def admin_api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.up_result.kubeconfig))

    def backend_api(self) -> Any:
        """The backend's identity: the rankpack-backend ServiceAccount's token."""
        from kubernetes import config

        path = self.up_result.service_account_kubeconfig
        return config.new_client_from_config(config_file=str(path))

    @property
    def namespace(self) -> str:
        return NAMESPACE

    def take_down(self, *, bring_up: bool = True) -> None:
        """The session's teardown, once: `down` with a pod running leaves nothing behind
        (`check_down_leaves_nothing`; on a cluster brought up again if a test took it
        down, unless ``bring_up`` is false); whatever happens, none is left running."""
        if self.taken_down:
            return
        self.taken_down = True
        try:
            if bring_up or clusterstate.status(self.state_dir)["ready"]:
                check_down_leaves_nothing(self)
        finally:
            if clusterstate.running_components(Layout(self.state_dir)):
                report = teardown.down(self.state_dir)
                assert not report.leftovers, report.leftovers


def check_down_leaves_nothing(dc: DevCluster) -> None:
    """`rankpack dev-cluster down` leaves no process, mount, cgroup, address or path, and
    a second `down` has nothing to do. Run on the cluster up, with a pod running."""
    from kubernetes import client

    dc.ensure_up()
    # A running pod, so that there are containers, shims, a netns and veths to clean up.
    core = client.CoreV1Api(dc.backend_api())
    core.create_namespaced_pod(dc.namespace, sleeper_pod("left-running", 100))
    pod = wait_running(core, "left-running", dc.namespace)
    pod_pids = [int(p) for p in (container_cgroup(pod) / "cgroup.procs").read_text().split()]
    assert pod_pids
    assert host.node_address_present() and host.link_exists(BRIDGE)
    down_leaves_nothing(dc.state_dir, dc.before, dc.links_before, pod_pids)


def down_leaves_nothing(
    state_dir: Path, before: dict[str, Any], links_before: set[str], pod_pids: list[int]
) -> None:
    """`rankpack dev-cluster down` (of a cluster of any number of nodes, some stopped) leaves
    no process, mount, cgroup, address, route, device, sysctl change or path, and a second
    `down` has nothing to do; checked here on our own, not trusting its report."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "down", "--json"],
        capture_output=True,
        text=True,
        # most of it is freeing the images' blocks: containerd's content and snapshots of
        # the rank image (~2 GB) go at the disk's discard speed here (~10 MB/s measured)
        timeout=600,
        check=False,
    )
    print(f"dev-cluster down took {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["leftovers"] == []
    assert report["stopped_pids"]

    # Checked here on our own, not trusting the report:
    state = str(state_dir)
    for pid in processes.all_pids():
        argv = processes.cmdline(pid)
        if not argv or not processes.running(pid):
            continue
        assert os.path.basename(argv[0]) not in CLUSTER_EXES, (pid, argv)
        assert not any(state in a for a in argv), (pid, argv)
    assert not any(processes.running(p) for p in pod_pids)
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    for prefix in (state, *(fixed for fixed, _ in NODE_BINDS)):
        assert f" {prefix}/" not in mounts and f" {prefix} " not in mounts, prefix
    assert not list(Path("/sys/fs/cgroup").glob("*/kubepods")), "kubepods cgroups left"
    assert not Path("/sys/fs/cgroup/kubepods").exists()
    for pattern in ("*/rankpack-node", "*/rankpack-node-*", f"*/{SYSTEM_CGROUP}"):
        assert not list(Path("/sys/fs/cgroup").glob(pattern)), f"{pattern} cgroups left"
    assert set(host.lo_addresses()) <= set(before.get("existing_addresses", [])), "lo addresses"
    assert not host.node_address_present(), f"{NODE_IP} still on lo"
    assert not host.service_address_present(), "the kubernetes Service address still on lo"
    assert not host.link_exists(BRIDGE)
    assert set(os.listdir("/sys/class/net")) <= links_before, "veth/bridge devices left"
    assert not set(host.unreachable_routes()) & set(UNREACHABLE_ROUTES), "routes left"
    for name in SYSCTLS:
        assert host.read_sysctl(name) == before["sysctls"][name], name
    for path in HOST_PATHS:
        if path not in before["existing_paths"]:
            assert not os.path.lexists(path), path
    # The logs survive for a post-mortem; nothing else of the state does.
    assert sorted(p.name for p in state_dir.iterdir()) == ["logs"]

    again = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "down"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout


def needs_cluster(item: pytest.Item) -> bool:
    """Marked `k8s`: under tests/k8s (tests/conftest.py marks them) or the contract
    suite's Kubernetes param."""
    return item.get_closest_marker("k8s") is not None


class DownAfterLastUser:
    """Registered by the session fixture as a plugin (so that it sees every test, not only
    those under tests/k8s): after the teardown of the last collected test that needs the
    cluster, takes it down. The order of the tests is whatever pytest collected."""

    def __init__(self, dc: DevCluster, items: list[pytest.Item]) -> None:
        self.dc = dc
        users = [item for item in items if needs_cluster(item)]
        self.last = users[-1] if users else None
        self.reached = False
        """The last user is being torn down: every test that needs the cluster has run."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        if item is not self.last:
            return (yield)
        self.reached = True
        try:
            return (yield)  # the test's own fixtures first (operators, Simulations)
        finally:
            self.dc.take_down()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.timeout(900))


def session_cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    """The body of the session fixture ``dev_cluster``. The fixture itself is declared in
    tests/conftest.py, once for every folder that uses it: a fixture imported into a
    second conftest is a second fixture, with its own session instance (the contract
    suite's cluster and this tier's would each be brought up)."""
    if os.geteuid() != 0:
        pytest.fail("the k8s tier needs root (run `bash setup.sh test` as root)")
    state_dir = default_state_dir()
    layout = Layout(state_dir)
    if layout.host_record.exists() or clusterstate.running_components(layout):
        # Start from a clean host so that `before` is the host without any cluster: also
        # after a cluster whose processes were killed without `down` (its record restores
        # what it changed, the kubelet's sysctls among them)
        report = teardown.down(state_dir)
        assert not report.leftovers, report.leftovers
    before = host.record()
    links_before = set(os.listdir("/sys/class/net"))
    version = binaries.KubeVersion.parse(binaries.DEFAULT_VERSION)
    opts = bringup.UpOptions(version=version, state_dir=state_dir, ready_timeout_s=180)
    result = bringup.up(opts)
    dc = DevCluster(state_dir, before, result, links_before)
    plugin = DownAfterLastUser(dc, request.session.items)
    request.config.pluginmanager.register(plugin, "rankpack-k8s-down-after-last-user")
    try:
        yield dc
        # Here first when the last user is the session's last test; else only when the
        # session stopped early (-x, Ctrl-C): then no cluster is brought up to be checked.
        dc.take_down(bring_up=plugin.reached)
    finally:
        request.config.pluginmanager.unregister(plugin)


@pytest.fixture
def k8s(dev_cluster: DevCluster) -> DevCluster:
    dev_cluster.ensure_up()
    return dev_cluster


@pytest.fixture
def k8s_down(dev_cluster: DevCluster) -> DevCluster:
    """The session's cluster, taken down (for tests of starting and failing to start)."""
    if clusterstate.running_components(Layout(dev_cluster.state_dir)):
        report = teardown.down(dev_cluster.state_dir)
        assert not report.leftovers, report.leftovers
    return dev_cluster


@pytest.fixture
def env(k8s: DevCluster, tmp_path: Path) -> Iterator[Any]:
    """A `rankpack operator` test's environment (`operators.Env`), cleaned up after."""
    from rankpack.operator import crd
    from tests.k8s.operators import Env

    e = Env(k8s, tmp_path)
    for o in e.simulations():  # a clean namespace: no Simulation of an earlier test
        e.custom.delete_namespaced_custom_object(
            crd.GROUP, crd.VERSION, k8s.namespace, crd.PLURAL, o["metadata"]["name"]
        )
    yield e
    for p in e.procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    e.cleanup()
    for o in e.simulations():
        e.custom.delete_namespaced_custom_object(
            crd.GROUP, crd.VERSION, k8s.namespace, crd.PLURAL, o["metadata"]["name"]
        )


@pytest.fixture(scope="module")
def two(dev_cluster: DevCluster) -> Iterator[DevCluster]:
    """The module's own dev cluster of two nodes (the session's one node is down meanwhile)."""
    with dev_cluster.nodes_up(2) as two_nodes:
        yield two_nodes
