"""`down`: stop everything `up` started, undo everything it changed on the host, then
check that nothing is left (`leftovers`). It only removes what `up` recorded as created by
it (``host-before.json``: what existed before).

Called by `rankpack.cli.devcluster_cmd` (`down`), by `bringup` (a failed start, or what a
previous cluster left behind) and by the `k8s` test tier's fixtures (`down`, `leftovers`).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.devcluster import host, processes
from rankpack.devcluster.layout import (
    HOST_PATHS,
    NODE_BINDS,
    SERVICE_FIRST_IP,
    UNREACHABLE_ROUTES,
    Layout,
    NodeLayout,
    NodeSpec,
)
from rankpack.devcluster.lifecycle.clusterstate import running_components
from rankpack.devcluster.lifecycle.nodes import crash
from rankpack.devcluster.lifecycle.preflight import locked, require_root


@dataclass
class DownReport:
    was_up: bool
    stopped_pids: list[int] = field(default_factory=list)
    unmounted: int = 0
    removed_cgroups: list[str] = field(default_factory=list)
    removed_paths: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def down(state_dir: Path) -> DownReport:
    """Stop everything `up` started and remove everything it created, then verify."""
    require_root()
    layout = Layout(state_dir)
    with locked(layout):
        if not layout.host_record.exists() and not running_components(layout):
            return DownReport(was_up=False)
        report = teardown(layout)
        with contextlib.suppress(OSError):
            layout.lock.unlink()
    return report


def teardown(layout: Layout) -> DownReport:
    """Take down whatever runs and whatever `up` changed; the caller holds the lock."""
    try:
        record: dict[str, Any] = json.loads(layout.host_record.read_text())
    except (OSError, ValueError):
        record = {}
    report = DownReport(was_up=bool(running_components(layout)))
    nodes = [layout.node(spec) for spec in layout.recorded_nodes()]
    _stop_processes(layout, record, nodes, report)
    _undo_host(layout, record, report)

    # Keep the logs for a post-mortem (the next `up` clears them); remove the rest.
    if layout.root.exists():
        for entry in layout.root.iterdir():
            if entry == layout.logs:
                continue
            host.safe_rmtree(entry)
    report.leftovers = leftovers(layout, record, nodes=[n.spec for n in nodes])
    return report


def _stop_processes(
    layout: Layout, record: dict[str, Any], nodes: list[NodeLayout], report: DownReport
) -> None:
    existing_kubepods = set(record.get("existing_kubepods", []))
    # The kubelets first, so that they restart nothing; then each node's containers (what
    # runs in its cgroup root), shims and containerd; then the rest in reverse start order.
    for name in ["kubelet", *(n.spec.component("kubelet") for n in nodes),
                 "kube-scheduler", "kube-controller-manager"]:  # fmt: skip
        pid = processes.read_pid(layout.pid_for(name))
        if pid is not None:
            report.stopped_pids.append(pid)
            processes.stop([pid])
    for cg in host.kubepods_cgroups():  # a one-node cluster of an older rankpack
        if str(cg) not in existing_kubepods:
            host.kill_all(host.cgroup_pids(cg))
    for node in nodes:
        report.stopped_pids += crash(layout, node)
    for name in ("containerd", "service-relay", "kube-apiserver", "etcd"):
        pid = processes.read_pid(layout.pid_for(name))
        if pid is not None:
            report.stopped_pids.append(pid)
            processes.stop([pid])
    stray = _our_processes(layout)
    report.stopped_pids += stray
    processes.stop(stray, timeout_s=5)
    processes.reap(report.stopped_pids)


def _undo_host(layout: Layout, record: dict[str, Any], report: DownReport) -> None:
    """Mounts, cgroups, bridges, addresses, routes, sysctls and the fixed paths: what `up`
    made and did not find."""
    existing_kubepods = set(record.get("existing_kubepods", []))
    existing_cgroups = set(record.get("existing_cgroups", []))
    created_paths = [
        p
        for p in HOST_PATHS
        if p not in record.get("existing_paths", HOST_PATHS) and os.path.lexists(p)
    ]
    mount_roots = _mount_roots(layout)
    before = len(host.mounts_under(mount_roots))
    left_mounts = host.unmount_all(mount_roots)
    report.unmounted = before - len(left_mounts)

    for cg in host.kubepods_cgroups():
        if str(cg) not in existing_kubepods and host.remove_cgroup_tree(cg):
            report.removed_cgroups.append(str(cg))
    for cg in host.cluster_cgroups():
        if str(cg) not in existing_cgroups and host.remove_cgroup_tree(cg):
            report.removed_cgroups.append(str(cg))

    existing_links = host.existing_links(record)
    for bridge in _bridges(layout):
        if bridge not in existing_links:
            host.remove_bridge(bridge)
    existing_addresses = host.existing_addresses(record)
    for address in _addresses(layout):
        if address not in existing_addresses:
            host.remove_address(address)
    for network in UNREACHABLE_ROUTES:
        if network not in record.get("existing_routes", UNREACHABLE_ROUTES):
            host.remove_unreachable_route(network)
    host.restore_sysctls(record.get("sysctls", {}))

    left_paths = host.remove_paths(created_paths)
    report.removed_paths = [p for p in created_paths if p not in left_paths]


def _our_processes(layout: Layout) -> list[int]:
    """Every process whose command line names the state directory (daemons, shims)."""
    root = str(layout.root)
    me = os.getpid()
    return [
        pid
        for pid in processes.all_pids()
        if pid != me
        and processes.running(pid)
        and any(root in arg for arg in processes.cmdline(pid))
    ]


def _mount_roots(layout: Layout) -> list[str]:
    roots = [str(layout.root), *(fixed for fixed, _name in NODE_BINDS)]
    return roots + [p for p in ("/var/run/netns",) if not os.path.islink("/var/run")]


def _bridges(layout: Layout, nodes: list[NodeSpec] | None = None) -> list[str]:
    """The recorded nodes' bridges, and any other ``rankpack<i>`` (a node `up` did not get
    to record)."""
    specs = layout.recorded_nodes() if nodes is None else nodes
    found = [s.bridge for s in specs]
    found += [d for d in host.links() if d.startswith("rankpack") and d[8:].isdigit()]
    return list(dict.fromkeys(found))


def _addresses(layout: Layout, nodes: list[NodeSpec] | None = None) -> list[str]:
    """The nodes' and the Service's addresses, and any other ``10.200.0.x`` on ``lo``."""
    specs = layout.recorded_nodes() if nodes is None else nodes
    found = [SERVICE_FIRST_IP, *(s.ip for s in specs)]
    found += [a for a in host.lo_addresses() if a.startswith("10.200.0.")]
    return list(dict.fromkeys(found))


def leftovers(
    layout: Layout, record: dict[str, Any], nodes: list[NodeSpec] | None = None
) -> list[str]:
    """What a cluster could leave behind and still exists: empty after a clean `down`."""
    found = [
        f"process {pid}: {' '.join(processes.cmdline(pid))[:80]}" for pid in _our_processes(layout)
    ]
    found += [f"mount {m}" for m in host.mounts_under(_mount_roots(layout))]
    existing = set(record.get("existing_kubepods", []))
    found += [f"cgroup {cg}" for cg in host.kubepods_cgroups() if str(cg) not in existing]
    existing = set(record.get("existing_cgroups", []))
    found += [f"cgroup {cg}" for cg in host.cluster_cgroups() if str(cg) not in existing]
    existing_addresses = host.existing_addresses(record)
    lo = host.lo_addresses()
    found += [
        f"address {a}/32 on lo"
        for a in _addresses(layout, nodes)
        if a in lo and a not in existing_addresses
    ]
    existing_links = host.existing_links(record)
    found += [
        f"network device {d}"
        for d in _bridges(layout, nodes)
        if host.link_exists(d) and d not in existing_links
    ]
    found += [
        f"route unreachable {r}"
        for r in host.unreachable_routes()
        if r in UNREACHABLE_ROUTES and r not in record.get("existing_routes", UNREACHABLE_ROUTES)
    ]
    for name, value in record.get("sysctls", {}).items():
        if value is not None and host.read_sysctl(name) != value:
            found.append(f"sysctl {name}={host.read_sysctl(name)} (was {value})")
    existing_paths = record.get("existing_paths", HOST_PATHS)
    found += [f"path {p}" for p in HOST_PATHS if p not in existing_paths and os.path.lexists(p)]
    return found
