"""Node-local readings of several nodes on one machine (the dev cluster's), and the node
agent's pods cgroup found from its own ``/proc/self/cgroup``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.api.config import KubernetesConfig, NodeFiles
from rankpack.backend.kubernetes.nodes.nodereader import own_pods_cgroup, resolve_pods_cgroup
from rankpack.backend.kubernetes.nodes.readings import local_readings
from rankpack.errors import UserError
from rankpack.profile.records import read_record
from tests.unit.backend.kubernetes.fakenode import FakeNodeFilesystems, new_uid, rank_pod_object


def _two_nodes(tmp_path: Path) -> tuple[KubernetesConfig, FakeNodeFilesystems, FakeNodeFilesystems]:
    a = FakeNodeFilesystems(tmp_path / "a", v2=False, pods_cgroup="node-a/kubepods")
    b = FakeNodeFilesystems(tmp_path / "b", v2=False, pods_cgroup="node-b/kubepods")
    config = replace(
        KubernetesConfig(),
        node_files=NodeFiles(tmp_path / "none", tmp_path / "none", "kubepods"),
        node_files_by_node=tuple(
            (name, NodeFiles(n.kubelet_root, n.cgroup_root, n.pods_cgroup))
            for name, n in (("node-a", a), ("node-b", b))
        ),
    )
    return config, a, b


def test_each_rank_pod_is_read_from_its_own_nodes_files(tmp_path: Path) -> None:
    config, a, b = _two_nodes(tmp_path)
    ua, ub = new_uid(), new_uid()
    a.add_cgroup(ua, usage_ns=111)
    b.add_cgroup(ub, usage_ns=222)
    # the same uid's cgroup on the wrong node would be read if nodes were mixed up
    a.add_cgroup(ub, usage_ns=999)
    readings = local_readings(config)
    assert readings.available
    ra = readings.read(rank_pod_object(ua, rank=0, node="node-a"))
    rb = readings.read(rank_pod_object(ub, rank=1, node="node-b"))
    assert ra is not None and ra.cpu is not None and ra.cpu.usage_ns == 111
    assert rb is not None and rb.cpu is not None and rb.cpu.usage_ns == 222
    # a pod of a node with no entry falls back to node_files, where nothing is
    other = readings.read(rank_pod_object(ua, rank=0, node="node-z"))
    assert other is not None and other.cpu is None


def test_wait_modes_reach_ranks_on_every_node(tmp_path: Path) -> None:
    config, a, b = _two_nodes(tmp_path)
    ua, ub = new_uid(), new_uid()
    paths = [a.write_record(ua, 0), b.write_record(ub, 1)]
    pods = [rank_pod_object(ua, rank=0, node="node-a"), rank_pod_object(ub, rank=1, node="node-b")]
    local_readings(config).set_wait_mode("s1", pods, "polite")
    for path in paths:
        rec = read_record(path)
        assert rec is not None and rec.wait_mode_requested == "polite"


def test_nothing_is_available_when_no_node_is_here(tmp_path: Path) -> None:
    config = replace(
        KubernetesConfig(),
        node_files=NodeFiles(tmp_path / "k", tmp_path / "c", "kubepods"),
        node_files_by_node=(("n", NodeFiles(tmp_path / "k2", tmp_path / "c2", "n/kubepods")),),
    )
    assert not local_readings(config).available


V1 = """12:cpuset:/rankpack-node-1/kubepods/burstable/pod1234/abcd
11:cpu,cpuacct:/rankpack-node-1/kubepods/burstable/pod1234/abcd
0::/
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (V1, "rankpack-node-1/kubepods"),
        ("4:cpu,cpuacct:/kubepods/besteffort/pod1/c\n", "kubepods"),
        ("0::/kubepods/pod1/c\n", "kubepods"),
        ("0::/\n", None),  # a cgroup namespace hides the path
        ("3:cpu:/user.slice\n", None),  # not in a pod
    ],
)
def test_the_agents_own_pods_cgroup(text: str, want: str | None) -> None:
    assert own_pods_cgroup(text) == want


def test_auto_falls_back_to_kubepods_and_other_values_are_checked(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text(V1)
    assert resolve_pods_cgroup("auto", proc) == "rankpack-node-1/kubepods"
    assert resolve_pods_cgroup("auto", tmp_path / "missing") == "kubepods"
    assert resolve_pods_cgroup("node-x/kubepods", proc) == "node-x/kubepods"
    with pytest.raises(UserError):
        resolve_pods_cgroup("../etc", proc)
