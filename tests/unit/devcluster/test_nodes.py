"""Several nodes on one machine: how `up --nodes N` splits the CPUs and names, addresses,
ports, bridges and cgroup roots of each node (pure builders, no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.devcluster import configs, host
from rankpack.devcluster.layout import (
    CONTROL_PLANE,
    NODE_BINDS,
    PORTS,
    Layout,
    NodeSpec,
    format_cpus,
    node_specs,
    parse_cpus,
)
from rankpack.errors import UserError

LAYOUT = Layout(Path("/srv/state"))


def test_cpus_split_evenly_one_core_each_on_two() -> None:
    a, b = node_specs(2, [0, 1])
    assert (a.name, a.cpus) == ("rankpack-node", (0,))
    assert (b.name, b.cpus) == ("rankpack-node-1", (1,))


def test_sixteen_cores_four_nodes_of_four_and_leftovers_belong_to_no_node() -> None:
    nodes = node_specs(4, range(16))
    assert [format_cpus(n.cpus) for n in nodes] == ["0-3", "4-7", "8-11", "12-15"]
    three = node_specs(3, range(16))
    assert [format_cpus(n.cpus) for n in three] == ["0-4", "5-9", "10-14"]


def test_one_node_has_every_cpu() -> None:
    (node,) = node_specs(1, [0, 1])
    assert node.cpus == (0, 1)
    assert node.name == "rankpack-node" and node.ip == "10.200.0.1"
    assert node.ports == {10248: "kubelet healthz of rankpack-node",
                          10250: "kubelet of rankpack-node"}  # fmt: skip
    assert set(node.ports) <= set(PORTS)


@pytest.mark.parametrize("count", [3, 0, -1])
def test_more_nodes_than_cpus_or_none_is_refused(count: int) -> None:
    with pytest.raises(UserError) as err:
        node_specs(count, [0, 1])
    assert "\n" not in str(err.value)


def test_each_node_has_its_own_address_ports_subnet_bridge_and_cgroup_root() -> None:
    nodes = node_specs(3, range(6))
    assert [n.ip for n in nodes] == ["10.200.0.1", "10.200.0.2", "10.200.0.3"]
    assert [n.pod_subnet for n in nodes] == ["10.201.0.0/24", "10.201.1.0/24", "10.201.2.0/24"]
    assert [n.pod_gateway for n in nodes] == ["10.201.0.1", "10.201.1.1", "10.201.2.1"]
    assert [n.bridge for n in nodes] == ["rankpack0", "rankpack1", "rankpack2"]
    assert [n.kubelet_port for n in nodes] == [10250, 10260, 10270]
    assert [n.healthz_port for n in nodes] == [10248, 10258, 10268]
    ports = [p for n in nodes for p in n.ports]
    assert len(set(ports)) == len(ports) and not set(ports) & {10257, 10259}
    assert [n.pods_cgroup for n in nodes] == [
        "rankpack-node/kubepods",
        "rankpack-node-1/kubepods",
        "rankpack-node-2/kubepods",
    ]
    assert all(host.is_node_cgroup_name(n.cgroup_root) for n in nodes)
    assert not host.is_node_cgroup_name("rankpack") and not host.is_node_cgroup_name("kubepods")


def test_kubelet_config_of_the_second_node() -> None:
    spec = node_specs(2, [0, 1])[1]
    node = LAYOUT.node(spec)
    cfg = configs.kubelet_config(LAYOUT, node)
    assert cfg["address"] == "10.200.0.2"
    assert (cfg["port"], cfg["healthzPort"]) == (10260, 10258)
    assert cfg["cgroupRoot"] == "/rankpack-node-1"
    assert "reservedSystemCPUs" not in cfg  # its kubelet sees only its own CPU online
    assert cfg["tlsCertFile"] == "/srv/state/pki/kubelet-rankpack-node-1.crt"
    assert cfg["containerRuntimeEndpoint"] == (
        "unix:///srv/state/nodes/rankpack-node-1/runtime/containerd/containerd.sock"
    )
    argv = configs.kubelet_argv(node, Path("/bin"))
    assert "--node-ip=10.200.0.2" in argv and "--hostname-override=rankpack-node-1" in argv
    assert "--root-dir=/var/lib/kubelet" in argv  # as the node sees it
    assert node.kubelet_root == Path("/srv/state/nodes/rankpack-node-1/runtime/kubelet")
    bridge = configs.cni_conflist(node)["plugins"][0]
    assert bridge["bridge"] == "rankpack1"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.201.1.0/24", "gateway": "10.201.1.1"}]]


def test_daemons_run_in_the_node_mount_namespace_with_its_directories_at_the_fixed_paths() -> None:
    node = LAYOUT.node(node_specs(2, [0, 1])[1])
    argv = configs.in_node_namespace(
        node, ["/usr/bin/containerd", "--config=x"], "/usr/bin/nsenter"
    )
    assert argv == [
        "/usr/bin/nsenter",
        "--mount=/srv/state/ns/rankpack-node-1",
        "--",
        "/usr/bin/containerd",
        "--config=x",
    ]
    binds = dict((fixed, src) for src, fixed in node.binds())
    assert binds.pop("/sys/devices/system/cpu/online") == node.cpu_online
    assert set(binds) == {fixed for fixed, _ in NODE_BINDS} >= {
        "/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/var/lib/cni",
        "/run/containerd", "/run/netns",
    }  # fmt: skip
    assert binds["/var/lib/kubelet"] == node.kubelet_root
    assert all(src.is_relative_to(node.runtime) for src in binds.values())


def test_components_in_start_order_and_recorded_nodes(tmp_path: Path) -> None:
    nodes = node_specs(2, [0, 1])
    layout = Layout(tmp_path)
    assert layout.components(nodes) == [
        "etcd",
        "containerd-rankpack-node",
        "containerd-rankpack-node-1",
        *CONTROL_PLANE[1:],
        "kubelet-rankpack-node",
        "kubelet-rankpack-node-1",
    ]
    assert layout.recorded_nodes() == []
    layout.nodes_file.write_text(json.dumps({"nodes": [n.to_json() for n in nodes]}))
    assert layout.recorded_nodes() == nodes
    assert NodeSpec.from_json(nodes[1].to_json()) == nodes[1]


@pytest.mark.parametrize(
    ("text", "cpus"), [("0-1", [0, 1]), ("0-3,6", [0, 1, 2, 3, 6]), ("5\n", [5]), ("", [])]
)
def test_cpu_lists(text: str, cpus: list[int]) -> None:
    assert parse_cpus(text) == cpus
    assert parse_cpus(format_cpus(cpus)) == cpus


def test_cli_refuses_more_nodes_than_cpus_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from rankpack.cli import main

    too_many = len(host.host_cpus()) + 1
    assert main(["dev-cluster", "up", "--nodes", str(too_many)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--nodes {too_many} needs at least one CPU per node" in err


def test_a_process_on_the_host_reads_each_node_where_its_kubelet_keeps_it(tmp_path: Path) -> None:
    """`with_node_files`: only a config that talks to this dev cluster gets its nodes."""
    from dataclasses import replace

    from rankpack.backend.kubernetes.api.config import KubernetesConfig
    from rankpack.devcluster.nodefiles import with_node_files

    nodes = node_specs(2, [0, 1])
    layout = Layout(tmp_path)
    layout.nodes_file.parent.mkdir(parents=True, exist_ok=True)
    layout.nodes_file.write_text(json.dumps({"nodes": [n.to_json() for n in nodes]}))
    ours = replace(KubernetesConfig(), kubeconfig=layout.admin_kubeconfig)
    got = dict(with_node_files(ours, tmp_path).node_files_by_node)
    assert list(got) == ["rankpack-node", "rankpack-node-1"]
    assert got["rankpack-node-1"].kubelet_root == layout.node(nodes[1]).kubelet_root
    assert got["rankpack-node-1"].pods_cgroup == "rankpack-node-1/kubepods"
    theirs = replace(KubernetesConfig(), kubeconfig=tmp_path.parent / "other.kubeconfig")
    assert with_node_files(theirs, tmp_path).node_files_by_node == ()
    assert with_node_files(KubernetesConfig(), tmp_path).node_files_by_node == ()
