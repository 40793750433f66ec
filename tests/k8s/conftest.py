"""The `k8s` tier: a real single-node cluster (`rankpack dev-cluster`), up once per session.

The session fixture takes down a cluster that is already up, records the host, brings the
dev cluster up with the cached binaries (`setup.sh test` builds them before pytest starts;
a cold build inside a test would exceed the per-test timeout) and takes it down at the end.
`test_zz_down.py` takes it down itself and checks that nothing is left; the fixture then
has nothing to do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.devcluster import binaries, cluster, host
from rankpack.devcluster.layout import NAMESPACE, default_state_dir


@dataclass
class DevCluster:
    state_dir: Path
    before: dict[str, Any]
    """host.record() taken before the session's `up`: what `down` must restore."""
    up_result: cluster.UpResult
    links_before: set[str]
    """Network devices present before the session's `up`."""

    def ensure_up(self) -> None:
        """Bring it (back) up if an earlier test took it down."""
        st = cluster.status(self.state_dir)
        if not st["ready"]:
            self.up_result = cluster.up(self.options())

    def options(self) -> cluster.UpOptions:
        return cluster.UpOptions(
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.k8s)
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    if os.geteuid() != 0:
        pytest.fail("the k8s tier needs root (run `bash setup.sh test` as root)")
    state_dir = default_state_dir()
    if cluster.running_components(cluster.Layout(state_dir)):
        # Start from a clean host so that `before` is the host without any cluster.
        report = cluster.down(state_dir)
        assert not report.leftovers, report.leftovers
    before = host.record()
    links_before = set(os.listdir("/sys/class/net"))
    version = binaries.KubeVersion.parse(binaries.DEFAULT_VERSION)
    opts = cluster.UpOptions(version=version, state_dir=state_dir, ready_timeout_s=180)
    result = cluster.up(opts)
    dc = DevCluster(state_dir, before, result, links_before)
    yield dc
    if cluster.running_components(cluster.Layout(state_dir)):
        report = cluster.down(state_dir)
        assert not report.leftovers, report.leftovers


@pytest.fixture
def k8s(dev_cluster: DevCluster) -> DevCluster:
    dev_cluster.ensure_up()
    return dev_cluster


@pytest.fixture
def k8s_down(dev_cluster: DevCluster) -> DevCluster:
    """The session's cluster, taken down (for tests of starting and failing to start)."""
    if cluster.running_components(cluster.Layout(dev_cluster.state_dir)):
        report = cluster.down(dev_cluster.state_dir)
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
