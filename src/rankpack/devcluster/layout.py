"""Where the dev cluster keeps its state, and the fixed facts of its network.

Everything `rankpack dev-cluster up` creates lives under one state directory (default
``/var/lib/rankpack/dev-cluster``, or ``$RANKPACK_DEV_CLUSTER_DIR``). The kubelet,
containerd and the CNI plugins also write fixed host paths whatever their flags say
(`HOST_PATHS`): each node's daemons run in a mount namespace of the node's own where that
node's directories (`NodeLayout.binds`) are mounted at those paths, so on the host they are
only (empty) mount points, recorded at `up` and removed at `down` only if `up` created them.

A cluster has one or more nodes (`NodeSpec`, `node_specs`): node 0 is ``rankpack-node``
(the one node of a one-node cluster), node i ``rankpack-node-<i>``, each with its own
address, kubelet ports, pod subnet and bridge, cgroup root and share of the CPUs.

Used by every other module of `rankpack.devcluster`; pure values (`Layout.recorded_nodes`
reads what `up` wrote), no side effects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.errors import UserError

NODE_NAME = "rankpack-node"
"""The first node's name (a one-node cluster's only node); node i > 0 is ``rankpack-node-<i>``."""
# The node IP may not be loopback and this kind of machine has no `dummy` netdev: a /32 on `lo`.
NODE_IP = "10.200.0.1"
"""The first node's address; node i has ``10.200.0.<i+1>``."""
NODE_NETWORK = "10.200.0.0/24"
POD_SUBNET = "10.201.0.0/24"
"""The first node's pod subnet; node i has ``10.201.<i>.0/24``."""
POD_GATEWAY = "10.201.0.1"
POD_NETWORK = "10.201.0.0/16"
"""Every node's pod subnet: what MPI's ``btl_tcp_if_include`` names on a multi-node cluster."""
SERVICE_SUBNET = "10.202.0.0/24"
SERVICE_FIRST_IP = "10.202.0.1"
"""The ``kubernetes`` Service's address: on ``lo`` too, where the relay stands in for kube-proxy."""
SERVICE_PORT = 443
BRIDGE = "rankpack0"
"""The first node's pod bridge; node i's is ``rankpack<i>``."""
CNI_NETWORK = "rankpack"
NAMESPACE = "rankpack"
# Packets for these networks never leave the machine: an `unreachable` route covers each,
# under the more specific routes of the node addresses (local) and the bridges.
UNREACHABLE_ROUTES = (NODE_NETWORK, POD_NETWORK, SERVICE_SUBNET)
SYSTEM_CGROUP = "rankpack-dev-cluster"
"""The cpu/cpuacct cgroup of the cluster's own daemons (control plane, containerd, kubelets),
with a high `SYSTEM_CPU_SHARES` so that rank pods cannot starve them."""
SYSTEM_CPU_SHARES = 10240
MAX_NODES = 200

APISERVER_PORT = 6443
# Every TCP port a one-node cluster listens on; `up` refuses to start when one is taken (and
# when a port of another node, `NodeSpec.ports`, is).
PORTS: dict[int, str] = {
    2379: "etcd client",
    2380: "etcd peer",
    APISERVER_PORT: "kube-apiserver",
    10248: "kubelet healthz",
    10250: "kubelet",
    10257: "kube-controller-manager",
    10259: "kube-scheduler",
}

KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
NODE_PORT_STEP = 10
"""Node i's kubelet listens on ``10250 + 10 i`` (healthz ``10248 + 10 i``)."""

PAUSE_IMAGE = "rankpack.local/pause:1"
# The "host /usr" image: an empty rootfs whose bin/lib/sbin link into usr/; pods mount the
# host's /usr read-only over it (see `rankpack.devcluster.images`).
HOST_USR_IMAGE = "rankpack.local/host-usr:1"

KUBELET_ROOT = "/var/lib/kubelet"
"""Every node's kubelet ``--root-dir`` as the node sees it (`NodeLayout.kubelet_root` on the
host)."""

# Paths written by the kubelet / containerd / CNI whatever the flags say.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/var/run/netns",
    "/etc/kubernetes",
)

# Sysctls the kubelet (its "kernel tunables") and the bridge plugin (ip_forward) may change.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)

# The control plane's processes in the order they start in (each node's containerd starts
# with etcd, its kubelet after the scheduler; they stop in the reverse order).
CONTROL_PLANE = (
    "etcd",
    "kube-apiserver",
    "service-relay",
    "kube-controller-manager",
    "kube-scheduler",
)
NODE_COMPONENTS = ("containerd", "kubelet")
"""Each node's own daemons, named ``<kind>-<node name>`` (`NodeSpec.component`)."""


def default_state_dir() -> Path:
    return Path(os.environ.get("RANKPACK_DEV_CLUSTER_DIR", "/var/lib/rankpack/dev-cluster"))


def node_name(index: int) -> str:
    return NODE_NAME if index == 0 else f"{NODE_NAME}-{index}"


def format_cpus(cpus: Iterable[int]) -> str:
    """A cpuset list (``0-3,6``) as cgroups and the kubelet write it."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpus(text: str) -> list[int]:
    """``0-3,6`` -> [0, 1, 2, 3, 6] (cpuset.cpus, /sys/devices/system/cpu/online)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


@dataclass(frozen=True)
class NodeSpec:
    """One node of the dev cluster: its name, addresses, ports, CPUs and cgroup root."""

    index: int
    cpus: tuple[int, ...]
    """The host CPUs this node's pods may run on (its cgroup root's ``cpuset.cpus``) and
    all its kubelet sees (`NodeLayout.cpu_online`): its capacity."""

    @property
    def name(self) -> str:
        return node_name(self.index)

    @property
    def ip(self) -> str:
        return f"10.200.0.{self.index + 1}"

    @property
    def pod_subnet(self) -> str:
        return f"10.201.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.201.{self.index}.1"

    @property
    def bridge(self) -> str:
        return f"rankpack{self.index}"

    @property
    def kubelet_port(self) -> int:
        return KUBELET_PORT + NODE_PORT_STEP * self.index

    @property
    def healthz_port(self) -> int:
        return KUBELET_HEALTHZ_PORT + NODE_PORT_STEP * self.index

    @property
    def ports(self) -> dict[int, str]:
        return {
            self.healthz_port: f"kubelet healthz of {self.name}",
            self.kubelet_port: f"kubelet of {self.name}",
        }

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot`` (below every hierarchy's root): its pods live in
        ``<cgroup_root>/kubepods``. Holds nothing but that."""
        return self.name

    @property
    def pods_cgroup(self) -> str:
        """The node's pods cgroup below a hierarchy's root (the node agent's
        ``pods_cgroup``): ``<node name>/kubepods``."""
        return f"{self.cgroup_root}/kubepods"

    def component(self, kind: str) -> str:
        """``containerd-<node>`` / ``kubelet-<node>``: the process's log and pid file name."""
        return f"{kind}-{self.name}"

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "cpus": list(self.cpus)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeSpec:
        return cls(int(data["index"]), tuple(data["cpus"]))


def node_specs(count: int, host_cpus: Sequence[int]) -> list[NodeSpec]:
    """`count` nodes splitting `host_cpus` evenly (in order, ``len // count`` each; CPUs left
    over belong to no node: they still run the cluster's own daemons). UserError when there
    are fewer CPUs than nodes."""
    cpus = sorted(set(host_cpus))
    if count < 1 or count > MAX_NODES:
        raise UserError(f"--nodes must be between 1 and {MAX_NODES}, not {count}")
    if count > len(cpus):
        raise UserError(
            f"--nodes {count} needs at least one CPU per node and this machine has "
            f"{len(cpus)} ({format_cpus(cpus)})"
        )
    each = len(cpus) // count
    return [NodeSpec(i, tuple(cpus[i * each : (i + 1) * each])) for i in range(count)]


CPU_ONLINE = "/sys/devices/system/cpu/online"
"""Where cAdvisor (in the kubelet) reads which CPUs are online: the node's namespace has a
file with the node's CPUs bound there, so its kubelet counts them as its capacity."""

# Node i's directories that its kubelet and containerd see at the fixed host paths (bind
# mounts in the node's own mount namespace): fixed path -> name below the node's runtime dir.
NODE_BINDS = (
    ("/var/lib/kubelet", "kubelet"),
    ("/var/log/containers", "log-containers"),
    ("/var/log/pods", "log-pods"),
    ("/var/lib/cni", "lib-cni"),
    ("/run/containerd", "run-containerd"),
    ("/run/netns", "run-netns"),
)


@dataclass(frozen=True)
class NodeLayout:
    """Paths of one node, under ``<state>/nodes/<name>/``: ``config/`` (written by `up`,
    kept across `stop-node`), ``runtime/`` (what the node's daemons write; removed by
    `start-node`, so that a node comes back empty)."""

    state: Path
    spec: NodeSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def root(self) -> Path:
        return self.state / "nodes" / self.name

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def runtime(self) -> Path:
        return self.root / "runtime"

    @property
    def stopped_marker(self) -> Path:
        """Exists while the node is stopped by `stop-node`."""
        return self.root / "stopped"

    @property
    def mount_namespace(self) -> Path:
        """The node's mount namespace, kept by a bind mount of its nsfs file (below the
        state directory's private ``ns/`` mount)."""
        return self.state / "ns" / self.name

    @property
    def containerd(self) -> Path:
        return self.runtime / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.config / "containerd.toml"

    @property
    def kubelet_root(self) -> Path:
        """Where this node's ``/var/lib/kubelet`` is on the host (its kubelet's
        ``--root-dir`` is ``/var/lib/kubelet``, bound here in the node's mount namespace):
        ``<kubelet_root>/pods/<uid>/volumes/...`` is what a DaemonSet's host path
        ``/var/lib/kubelet`` shows on this node."""
        return self.runtime / "kubelet"

    @property
    def kubelet_pki(self) -> Path:
        return self.config / "kubelet-pki"

    @property
    def kubelet_config(self) -> Path:
        return self.config / "kubelet-config.json"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.config / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.runtime / "log-pods"

    @property
    def cni_conf_dir(self) -> Path:
        return self.config / "cni"

    @property
    def cni_data_dir(self) -> Path:
        return self.runtime / "cni-ipam"

    @property
    def cpu_online(self) -> Path:
        """The node's CPUs as ``/sys/devices/system/cpu/online`` shows them to its daemons."""
        return self.config / "cpu-online"

    def binds(self) -> list[tuple[Path, str]]:
        """(host directory or file of this node, fixed path it is mounted at in its
        namespace): the runtime directories, and `cpu_online`."""
        dirs = [(self.runtime / name, fixed) for fixed, name in NODE_BINDS]
        return [*dirs, (self.cpu_online, CPU_ONLINE)]


@dataclass(frozen=True)
class Layout:
    """Paths under the state directory. Pure: constructing one creates nothing."""

    root: Path

    @property
    def lock(self) -> Path:
        return self.root.parent / f".{self.root.name}.lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def namespaces(self) -> Path:
        """Holds each node's mount namespace file; a private bind mount of itself."""
        return self.root / "ns"

    @property
    def nodes_file(self) -> Path:
        """The nodes `up` started (`NodeSpec.to_json` each)."""
        return self.root / "nodes.json"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def image_archives(self) -> Path:
        """OCI archives of every image imported into the nodes' containerd, with
        ``index.json`` naming their references: `start-node` imports them again."""
        return self.images / "archives"

    @property
    def tokens_file(self) -> Path:
        return self.pki / "tokens.csv"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def service_account_kubeconfig(self) -> Path:
        return self.root / "rankpack-sa.kubeconfig"

    @property
    def host_record(self) -> Path:
        """What `up` found on the host (sysctls, existing paths), for `down` to restore."""
        return self.root / "host-before.json"

    @property
    def version_file(self) -> Path:
        return self.root / "version"

    def kubeconfig_for(self, component: str) -> Path:
        return self.root / f"{component}.kubeconfig"

    def log_for(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid_for(self, component: str) -> Path:
        return self.pids / f"{component}.pid"

    def node(self, spec: NodeSpec) -> NodeLayout:
        return NodeLayout(self.root, spec)

    def recorded_nodes(self) -> list[NodeSpec]:
        """The nodes `up` recorded (none if it did not get that far)."""
        try:
            data = json.loads(self.nodes_file.read_text())
            return [NodeSpec.from_json(d) for d in data["nodes"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def components(self, nodes: Sequence[NodeSpec] | None = None) -> list[str]:
        """Every process of the cluster, in start order (the recorded nodes by default)."""
        nodes = self.recorded_nodes() if nodes is None else nodes
        etcd, *rest = CONTROL_PLANE
        return [
            etcd,
            *(n.component("containerd") for n in nodes),
            *rest,
            *(n.component("kubelet") for n in nodes),
        ]
