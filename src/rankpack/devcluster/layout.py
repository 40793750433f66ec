"""Where the dev cluster keeps its state, and the fixed facts of its network.

Everything `rankpack dev-cluster up` creates lives under one state directory (default
``/var/lib/rankpack/dev-cluster``, or ``$RANKPACK_DEV_CLUSTER_DIR``), except what the
kubelet, containerd and the CNI plugins write to fixed host paths whatever their flags say
(`HOST_PATHS`); those are recorded at `up` and removed at `down` only if `up` created them.

Used by every other module of `rankpack.devcluster`; pure values, no side effects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "rankpack-node"
# The node IP may not be loopback and this kind of machine has no `dummy` netdev: a /32 on `lo`.
NODE_IP = "10.200.0.1"
POD_SUBNET = "10.201.0.0/24"
POD_GATEWAY = "10.201.0.1"
SERVICE_SUBNET = "10.202.0.0/24"
SERVICE_FIRST_IP = "10.202.0.1"
"""The ``kubernetes`` Service's address: on ``lo`` too, where the relay stands in for kube-proxy."""
SERVICE_PORT = 443
BRIDGE = "rankpack0"
CNI_NETWORK = "rankpack"
NAMESPACE = "rankpack"

APISERVER_PORT = 6443
# Every TCP port the cluster listens on; `up` refuses to start when one is taken.
PORTS: dict[int, str] = {
    2379: "etcd client",
    2380: "etcd peer",
    APISERVER_PORT: "kube-apiserver",
    10248: "kubelet healthz",
    10250: "kubelet",
    10257: "kube-controller-manager",
    10259: "kube-scheduler",
}

PAUSE_IMAGE = "rankpack.local/pause:1"
# The "host /usr" image: an empty rootfs whose bin/lib/sbin link into usr/; pods mount the
# host's /usr read-only over it (see `rankpack.devcluster.images`).
HOST_USR_IMAGE = "rankpack.local/host-usr:1"

KUBELET_ROOT = "/var/lib/kubelet"

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

# The order processes start in (and the reverse of the order they stop in).
COMPONENTS = (
    "etcd",
    "containerd",
    "kube-apiserver",
    "service-relay",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
)


def default_state_dir() -> Path:
    return Path(os.environ.get("RANKPACK_DEV_CLUSTER_DIR", "/var/lib/rankpack/dev-cluster"))


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
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.containerd / "config.toml"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir``: the standard path, so that a host path into it
        (the node agent's view of pod volumes) means the same as on any node. Removed by
        `down` when `up` created it (`HOST_PATHS`)."""
        return Path(KUBELET_ROOT)

    @property
    def kubelet_pki(self) -> Path:
        return self.root / "kubelet-pki"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.json"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def images(self) -> Path:
        return self.root / "images"

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
