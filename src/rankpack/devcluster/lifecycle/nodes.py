"""Each node's daemons: its mount namespace and containerd, its kubelet, started (`up`,
`start-node`) and crashed (`stop-node`, `down`).

Called by `bringup` (`start_runtime`, `start_kubelet`), `teardown` (`crash`), by
`rankpack.cli.devcluster_cmd` (`stop_node`, `start_node`) and by the `k8s` tier's fault
tests (a node lost).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rankpack.devcluster import binaries, configs, host, images, packages, processes
from rankpack.devcluster.binaries import KubeVersion
from rankpack.devcluster.layout import CONTROL_PLANE, NODE_COMPONENTS, Layout, NodeLayout, NodeSpec
from rankpack.devcluster.lifecycle.clusterstate import (
    node_named,
    recorded_version,
    running_components,
)
from rankpack.devcluster.lifecycle.preflight import locked, require_root
from rankpack.devcluster.lifecycle.probes import api_client, node_ready, wait_for
from rankpack.errors import UserError


def start_runtime(
    layout: Layout, node: NodeLayout, env: dict[str, str], cgroups: list[Path]
) -> None:
    """The node's mount namespace (its runtime directories at the fixed paths) and its
    containerd in it. The node's runtime directory must be empty or absent."""
    node.runtime.mkdir(parents=True, exist_ok=True)
    for d in (node.containerd, node.cni_data_dir):
        d.mkdir(parents=True, exist_ok=True)
    host.create_node_namespace(
        node.mount_namespace, node.binds(), packages.tool("unshare"), packages.tool("nsenter")
    )
    argv = configs.containerd_argv(node, packages.tool("containerd"))
    processes.start(
        configs.in_node_namespace(node, argv, packages.tool("nsenter")),
        layout.log_for(node.spec.component("containerd")),
        layout.pid_for(node.spec.component("containerd")),
        env,
        cgroups,
    )


def start_kubelet(
    layout: Layout, node: NodeLayout, bin_dir: Path, env: dict[str, str], cgroups: list[Path]
) -> None:
    processes.start(
        configs.in_node_namespace(node, configs.kubelet_argv(node, bin_dir),
                                  packages.tool("nsenter")),
        layout.log_for(node.spec.component("kubelet")),
        layout.pid_for(node.spec.component("kubelet")),
        env,
        cgroups,
    )  # fmt: skip


def _node_cgroups(spec: NodeSpec) -> list[Path]:
    return [h / spec.cgroup_root for h in host.hierarchies() if (h / spec.cgroup_root).is_dir()]


def crash(layout: Layout, node: NodeLayout, timeout_s: float = 20) -> list[int]:
    """SIGKILL the node's kubelet, containerd and shims, whatever else runs in its mount
    namespace (CNI plugins) and every process of its pods (its cgroup root), until none is
    left (bounded); then drop its namespace (with it the pods' mounts and network
    namespaces, so their veths) and its bridge. Returns the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [
            p
            for p in (processes.read_pid(layout.pid_for(node.spec.component(k)))
                      for k in ("kubelet", "containerd"))
            if p is not None
        ]  # fmt: skip
        pids += processes.shims_of(node.containerd_socket)
        pids += host.pids_in_namespace(node.mount_namespace)
        for cg in _node_cgroups(node.spec):
            pids += host.cgroup_pids(cg)
        pids = [p for p in dict.fromkeys(pids) if p != os.getpid() and processes.running(p)]
        if not pids or time.monotonic() > deadline:
            break
        host.kill_all(pids)
        killed += [p for p in pids if p not in killed]
        time.sleep(0.05)
    processes.reap(killed)
    for kind in NODE_COMPONENTS:
        with contextlib.suppress(OSError):
            layout.pid_for(node.spec.component(kind)).unlink()
    host.drop_node_namespace(node.mount_namespace)
    host.remove_bridge(node.spec.bridge)
    return killed


# -- one node crashed and brought back (fault tests: a node lost) -----------------------


@dataclass(frozen=True)
class NodeStopped:
    name: str
    killed_pids: list[int]


def stop_node(state_dir: Path, name: str) -> NodeStopped:
    """A node crash: SIGKILL to its kubelet, containerd, shims and every process of its pods;
    its mount namespace and pod network (bridge, veths, network namespaces) gone. Its Node
    object, address and cgroup root stay (the control plane sees the node stop answering)."""
    require_root()
    layout = Layout(state_dir)
    with locked(layout):
        spec = node_named(layout, name)
        node = layout.node(spec)
        killed = crash(layout, node)
        node.stopped_marker.touch()
    return NodeStopped(name, killed)


def start_node(state_dir: Path, name: str, timeout_s: float = 180.0) -> float:
    """Bring a stopped node back empty: its containers' state, pod directories, IPAM and
    cgroups removed, a new namespace, containerd (with the images) and kubelet; waits
    (bounded) until the node is Ready. Returns the seconds that took; 0 if it ran."""
    require_root()
    started = time.monotonic()
    layout = Layout(state_dir)
    with locked(layout):
        spec = node_named(layout, name)
        node = layout.node(spec)
        if not all(c in running_components(layout) for c in CONTROL_PLANE):
            raise UserError("the control plane is not running; `rankpack dev-cluster up` first")
        if processes.read_pid(layout.pid_for(spec.component("kubelet"))) is not None:
            return 0.0
        _clear(layout, node)
        env, system = processes.daemon_env(), host.make_system_cgroup()
        start_runtime(layout, node, env, system)
        log = str(layout.log_for(spec.component("containerd")))
        wait_for(f"containerd of {name}", node.containerd_socket.exists, timeout_s, layout, log)
        images.import_all(layout, node)
        version = KubeVersion.parse(recorded_version(layout) or binaries.DEFAULT_VERSION)
        start_kubelet(layout, node, binaries.bin_dir(version), env, system)
        api = api_client(layout.admin_kubeconfig)
        wait_for(
            f"node {name} Ready",
            lambda: node_ready(api, name),
            timeout_s,
            layout,
            str(layout.log_for(spec.component("kubelet"))),
        )
        node.stopped_marker.unlink(missing_ok=True)
    return time.monotonic() - started


def _clear(layout: Layout, node: NodeLayout) -> None:
    """What is left of a stopped node gone (a kubelet that died alone, its cgroups, its
    runtime directory); its cgroup root and namespace directory made again."""
    crash(layout, node)
    for cg in _node_cgroups(node.spec):
        if not host.remove_cgroup_tree(cg):
            raise UserError(f"cannot remove {cg}: something still runs there")
    host.make_node_cgroup(node.spec)
    if node.runtime.exists() and not host.safe_rmtree(node.runtime):
        raise UserError(f"cannot clear {node.runtime}: something is mounted below it")
    host.prepare_namespace_dir(layout.namespaces)
