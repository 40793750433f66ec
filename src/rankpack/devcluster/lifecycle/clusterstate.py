"""What a dev cluster is right now: what `up` recorded (version, nodes), which of its
processes run, and `status` (`rankpack dev-cluster status`, the node list from the API).

Called by `rankpack.cli.devcluster_cmd` (`status`), by `bringup`, `teardown`, `nodes` and
`restarts`, and by the `k8s` test tier's fixtures (`tests/k8s/conftest.py`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.objects import status as readings
from rankpack.backend.protocol import BackendError
from rankpack.devcluster import processes
from rankpack.devcluster.layout import (
    CONTROL_PLANE,
    NAMESPACE,
    NODE_COMPONENTS,
    Layout,
    NodeSpec,
    format_cpus,
)
from rankpack.devcluster.lifecycle.probes import api_client
from rankpack.errors import UserError


def running_components(layout: Layout) -> dict[str, int]:
    found = {}
    for name in layout.components():
        pid = processes.read_pid(layout.pid_for(name))
        if pid is not None:
            found[name] = pid
    return found


def expected_components(layout: Layout) -> list[str]:
    """What runs when the cluster is up: all of it but the nodes `stop-node` stopped."""
    nodes = layout.recorded_nodes()
    return layout.components([n for n in nodes if not layout.node(n).stopped_marker.exists()])


def node_named(layout: Layout, name: str) -> NodeSpec:
    nodes = layout.recorded_nodes()
    for spec in nodes:
        if spec.name == name:
            return spec
    if not nodes:
        raise UserError(f"no dev cluster in {layout.root}; run `rankpack dev-cluster up` first")
    raise UserError(f"no node {name}; the nodes are {', '.join(n.name for n in nodes)}")


def recorded_version(layout: Layout) -> str | None:
    try:
        return layout.version_file.read_text().strip()
    except OSError:
        return None


def status(state_dir: Path) -> dict[str, Any]:
    """The cluster as `status --json` reports it."""
    layout = Layout(state_dir)
    if layout.root.exists() and not os.access(layout.root, os.R_OK | os.X_OK):
        raise UserError(f"cannot read {layout.root}: run `rankpack dev-cluster status` as root")
    live = running_components(layout)
    version = recorded_version(layout)
    result: dict[str, Any] = {
        "ready": False,
        "running": [c for c in layout.components() if c in live],
        "version": version,
        "kubeconfig": str(layout.admin_kubeconfig) if live else None,
        "service_account_kubeconfig": (
            str(layout.service_account_kubeconfig)
            if live and layout.service_account_kubeconfig.exists()
            else None
        ),
        "namespace": NAMESPACE,
        "state_dir": str(layout.root),
        "logs": str(layout.logs),
        "nodes": [],
    }
    specs = {s.name: s for s in layout.recorded_nodes()}
    if not all(c in live for c in CONTROL_PLANE) or not os.access(layout.admin_kubeconfig, os.R_OK):
        return result
    try:
        api = api_client(layout.admin_kubeconfig)
        api_nodes = {n["metadata"]["name"]: n for n in api.list_nodes()}
    except BackendError as exc:  # the apiserver may be starting or gone: report, not crash
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return result
    for name in [*specs, *(n for n in api_nodes if n not in specs)]:
        result["nodes"].append(_node_entry(layout, name, api_nodes.get(name, {}), specs, live))
    result["ready"] = bool(result["nodes"]) and all(n["ready"] for n in result["nodes"])
    return result


def _node_entry(
    layout: Layout,
    name: str,
    node: dict[str, Any],
    specs: dict[str, NodeSpec],
    live: dict[str, int],
) -> dict[str, Any]:
    """One node of `status`: what the API says, and what `up` recorded of it (if it did)."""
    entry: dict[str, Any] = {
        "name": name,
        "ready": readings.node_ready(node),
        "allocatable_millis": readings.node_allocatable_millis(node),
        "kubelet_version": node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion"),
    }
    spec = specs.get(name)
    if spec is not None:
        nl = layout.node(spec)
        entry |= {
            "registered": bool(node),
            "stopped": nl.stopped_marker.exists(),
            "running": all(spec.component(k) in live for k in NODE_COMPONENTS),
            "cpus": format_cpus(spec.cpus),
            "cpu_count": len(spec.cpus),
            "ip": spec.ip,
            "kubelet_port": spec.kubelet_port,
            "pod_subnet": spec.pod_subnet,
            "pods_cgroup": spec.pods_cgroup,
            "kubelet_root": str(nl.kubelet_root),
        }
    return entry
