"""Pure builders of the dev cluster's configuration: command lines, config files, kubeconfigs.

Spec in, object or text out; nothing here touches the machine, so every builder is unit
tested without a cluster (`tests/unit/devcluster/`). `rankpack.devcluster.lifecycle` writes
what these return and starts the processes with the argv lists (never a shell string).

The settings follow what a single-node cluster on this kind of machine needed (cgroup v1,
root without CAP_SYS_RESOURCE, no systemd): see docs/kubernetes.md.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.devcluster.layout import (
    APISERVER_PORT,
    CNI_NETWORK,
    KUBELET_ROOT,
    NODE_IP,
    PAUSE_IMAGE,
    SERVICE_FIRST_IP,
    SERVICE_PORT,
    SERVICE_SUBNET,
    Layout,
    NodeLayout,
)

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")


@dataclass(frozen=True)
class Identity:
    """A static-token identity of the apiserver's token file."""

    user: str
    groups: tuple[str, ...]
    token: str


def api_server_url() -> str:
    return f"https://127.0.0.1:{APISERVER_PORT}"


def token_file(identities: list[Identity]) -> str:
    """kube-apiserver --token-auth-file: `token,user,uid,"group1,group2"` per line."""
    lines = []
    for ident in identities:
        groups = ",".join(ident.groups)
        lines.append(f'{ident.token},{ident.user},{ident.user},"{groups}"')
    return "\n".join(lines) + "\n"


def kubeconfig(
    *, server: str, ca_pem: str, user: str, token: str, namespace: str | None = None
) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user (bearer token) and one current context."""
    import base64

    context: dict[str, Any] = {"cluster": "rankpack-dev", "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "rankpack-dev",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem.encode()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "rankpack-dev", "context": context}],
        "current-context": "rankpack-dev",
        "preferences": {},
    }


def etcd_argv(layout: Layout, etcd: str = "etcd") -> list[str]:
    return [
        etcd,
        "--name=rankpack",
        f"--data-dir={layout.etcd_data}",
        "--listen-client-urls=http://127.0.0.1:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=rankpack=http://127.0.0.1:2380",
        "--initial-cluster-state=new",
        # A throw-away cluster: losing the last writes on a crash is fine, fsync is not.
        "--unsafe-no-fsync",
    ]


def apiserver_argv(layout: Layout, bin_dir: Path) -> list[str]:
    pki = layout.pki
    return [
        str(bin_dir / "kube-apiserver"),
        "--etcd-servers=http://127.0.0.1:2379",
        "--bind-address=127.0.0.1",
        f"--secure-port={APISERVER_PORT}",
        f"--advertise-address={NODE_IP}",
        f"--cert-dir={pki / 'apiserver-generated'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={layout.tokens_file}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--profiling=false",
        "--endpoint-reconciler-type=none",
    ]


def controller_manager_argv(layout: Layout, bin_dir: Path) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={layout.kubeconfig_for('kube-controller-manager')}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={layout.pki / 'sa.key'}",
        f"--root-ca-file={layout.pki / 'ca.crt'}",
        # No cloud, and the pod CIDR comes from the CNI config, not from the node object.
        "--controllers=*,-nodeipam,-cloud-node-lifecycle",
        "--profiling=false",
    ]


def scheduler_argv(layout: Layout, bin_dir: Path) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={layout.kubeconfig_for('kube-scheduler')}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
    ]


def relay_argv(layout: Layout) -> list[str]:
    """The relay standing in for kube-proxy for the ``kubernetes`` Service (`relay`); the
    state directory in its argv marks it as the cluster's for `down`."""
    return [
        sys.executable, "-m", "rankpack.devcluster.relay",
        f"{SERVICE_FIRST_IP}:{SERVICE_PORT}", f"127.0.0.1:{APISERVER_PORT}", str(layout.root),
    ]  # fmt: skip


def in_node_namespace(node: NodeLayout, argv: list[str], nsenter: str = "nsenter") -> list[str]:
    """`argv` run in the node's mount namespace (where its own directories are mounted at
    the fixed paths). nsenter execs it: the pid stays the daemon's."""
    return [nsenter, f"--mount={node.mount_namespace}", "--", *argv]


def kubelet_argv(node: NodeLayout, bin_dir: Path) -> list[str]:
    return [
        str(bin_dir / "kubelet"),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubelet_kubeconfig}",
        f"--root-dir={KUBELET_ROOT}",
        f"--cert-dir={node.kubelet_pki}",
        f"--node-ip={node.spec.ip}",
        f"--hostname-override={node.name}",
    ]


def containerd_argv(node: NodeLayout, containerd: str = "containerd") -> list[str]:
    return [containerd, f"--config={node.containerd_config}"]


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these values
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def toml_text(tables: dict[str, dict[str, object]], top: dict[str, object]) -> str:
    """A small TOML writer: top-level keys, then `[table]` sections of scalar keys."""
    out = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for name, keys in tables.items():
        out += ["", f"[{name}]"]
        out += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(out) + "\n"


def containerd_config(node: NodeLayout, runc: str = "/usr/sbin/runc") -> str:
    """containerd 1.6 config (version 2) of one node: everything under the node's runtime
    directory (its shims' sockets go to /run/containerd, the node's own in its namespace)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    root = node.containerd
    return toml_text(
        top={
            "version": 2,
            "root": str(root / "root"),
            "state": str(root / "state"),
            "disabled_plugins": [
                "io.containerd.snapshotter.v1.aufs",
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.snapshotter.v1.devmapper",
            ],
        },
        tables={
            "grpc": {"address": str(node.containerd_socket)},
            "ttrpc": {"address": str(node.containerd_socket) + ".ttrpc"},
            'plugins."io.containerd.internal.v1.opt"': {"path": str(root / "opt")},
            cri: {
                "sandbox_image": PAUSE_IMAGE,
                # Required without CAP_SYS_RESOURCE: runc cannot lower oom_score_adj, and
                # every container failed with "can't get final child's PID from pipe".
                "restrict_oom_score_adj": True,
                "stream_server_address": "127.0.0.1",
                "stream_server_port": "0",
                "enable_selinux": False,
            },
            f"{cri}.containerd": {"snapshotter": "overlayfs", "default_runtime_name": "runc"},
            f"{cri}.containerd.runtimes.runc": {"runtime_type": "io.containerd.runc.v2"},
            f"{cri}.containerd.runtimes.runc.options": {
                "SystemdCgroup": False,
                "BinaryName": runc,
                "Root": str(root / "runc"),
            },
            f"{cri}.cni": {
                "bin_dir": str(CNI_BIN_DIR),
                "conf_dir": str(node.cni_conf_dir),
                "max_conf_num": 1,
            },
        },
    )


def cni_conflist(node: NodeLayout) -> dict[str, Any]:
    """A bridge + host-local network: the node is NotReady until a CNI config exists. Each
    node has its own bridge and subnet on the host; the host routes between them."""
    spec = node.spec
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": spec.bridge,
                "isGateway": True,
                # No masquerading: pods talk to each other and to the host, nothing else,
                # and no iptables rules are left behind.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(node.cni_data_dir),
                    "ranges": [[{"subnet": spec.pod_subnet, "gateway": spec.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(layout: Layout, node: NodeLayout) -> dict[str, Any]:
    """KubeletConfiguration (JSON is valid YAML) for a cgroup v1, cgroupfs, no-swap-check node
    with its own address, ports, cgroup root and share of the CPUs."""
    pki = layout.pki
    spec = node.spec
    cfg: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": spec.ip,
        "port": spec.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": spec.healthz_port,
        "tlsCertFile": str(pki / f"kubelet-{node.name}.crt"),
        "tlsPrivateKeyFile": str(pki / f"kubelet-{node.name}.key"),
        # Only the apiserver (a client certificate signed by the cluster CA) may call the
        # kubelet; what it forwards (exec, logs) the apiserver has already authorized.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        # The node's pods live in <cgroupRoot>/kubepods; `up` creates the root in every
        # hierarchy first, its cpuset.cpus the node's CPUs (the pods' cgroups inherit it).
        "cgroupRoot": f"/{spec.cgroup_root}",
        # Kubernetes >= 1.35 refuses cgroup v1 unless told otherwise; this machine is v1.
        "failCgroupV1": False,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        # The default, in the node's namespace: <runtime>/log-pods on the host.
        "podLogsDir": "/var/log/pods",
        "clusterDomain": "cluster.local",
        # No resolver in pods: the dev cluster has no cluster DNS, and the host's resolver
        # is off this machine (pods must send nothing off it) and unreachable from the pod
        # network, so every lookup in a pod waited for its timeouts (mpirun resolving the
        # rank pods' names in its hostfile: ~60 s per launch). With none, a lookup fails at
        # once (glibc tries 127.0.0.1 in the pod's own network namespace).
        "resolvConf": "",
        # Locally imported images cannot be pulled again: never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "maxPods": 110,
        "serializeImagePulls": False,
        "registerNode": True,
    }
    # No reserved CPUs: in its namespace the kubelet's cAdvisor sees only the node's CPUs
    # online (`NodeLayout.cpu_online`), so capacity = allocatable = the node's share. (With
    # every host CPU seen and the others reserved, the kubelet writes all of them into
    # <cgroupRoot>/kubepods/cpuset.cpus, which the node's cpuset refuses.)
    return cfg


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"
