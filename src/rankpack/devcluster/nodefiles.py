"""Where the dev cluster's nodes keep what a node reader reads, seen from this machine.

Every node of the dev cluster runs on this machine, its kubelet in a mount namespace of its
own: the kubelet's ``/var/lib/kubelet`` is `NodeLayout.kubelet_root` on the host and its pods
cgroup is ``<node>/kubepods`` (`NodeSpec.pods_cgroup`). A rankpack process on the host (the
CLI's ``run --backend kubernetes``, an operator started from the shell) that talks to the dev
cluster reads each rank pod's node with `KubernetesConfig.node_files_by_node` from here
(``readings: node-local``); in the cluster the node agents read them (``node-agent``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rankpack.backend.kubernetes.api.config import KubernetesConfig, NodeFiles
from rankpack.devcluster.layout import Layout, default_state_dir


def node_files(layout: Layout) -> tuple[tuple[str, NodeFiles], ...]:
    """Each recorded node's files as the host sees them."""
    return tuple(
        (spec.name, NodeFiles(kubelet_root=layout.node(spec).kubelet_root,
                              pods_cgroup=spec.pods_cgroup))
        for spec in layout.recorded_nodes()
    )  # fmt: skip


def talks_to(layout: Layout, kubeconfig: Path | None) -> bool:
    """`kubeconfig` is one of this dev cluster's (below its state directory)."""
    if kubeconfig is None:
        return False
    try:
        return kubeconfig.resolve().is_relative_to(layout.root.resolve())
    except OSError:
        return False


def with_node_files(config: KubernetesConfig, state_dir: Path | None = None) -> KubernetesConfig:
    """`config` with the dev cluster's node files when it talks to the dev cluster of this
    machine; else unchanged."""
    layout = Layout(state_dir or default_state_dir())
    if not talks_to(layout, config.kubeconfig):
        return config
    found = node_files(layout)
    return replace(config, node_files_by_node=found) if found else config
