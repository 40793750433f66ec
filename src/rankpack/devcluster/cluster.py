"""`up`, `down`, `status`, `stop-node` and `start-node` of the dev cluster.

Called by `rankpack.cli.devcluster_cmd` and by the `k8s` test tier's fixtures
(`tests/k8s/conftest.py`). `up` checks the machine (root, packages, ports, CPUs, no other
cluster), builds or reuses the cached binaries, generates certificates and configs, adds the
node and Service addresses and the unreachable routes, creates the daemons' cgroup and each
node's cgroup root (its share of the CPUs) and mount namespace, starts etcd, the control
plane and each node's containerd and kubelet detached, builds the local images and imports
them into every node, waits (bounded) for every node to be Ready and applies the backend's
namespace and RBAC. `down` undoes every one of those steps and then checks that nothing is
left; it only removes what `up` recorded as created by it. `stop-node` crashes one node
(SIGKILL to its daemons and every process of its pods, its namespace and pod network gone);
`start-node` brings it back empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.objects import status as readings
from rankpack.backend.protocol import BackendError
from rankpack.devcluster import binaries, configs, host, images, packages, pki, processes, rbac
from rankpack.devcluster.binaries import KubeVersion
from rankpack.devcluster.layout import (
    CONTROL_PLANE,
    HOST_PATHS,
    NAMESPACE,
    NODE_BINDS,
    NODE_COMPONENTS,
    PORTS,
    SERVICE_FIRST_IP,
    UNREACHABLE_ROUTES,
    Layout,
    NodeLayout,
    NodeSpec,
    format_cpus,
    node_specs,
)
from rankpack.errors import UserError

FOREIGN_DAEMONS = {"kubelet", "kube-apiserver", "etcd", "k3s", "k0s"}


@dataclass(frozen=True)
class UpOptions:
    version: KubeVersion
    state_dir: Path
    ready_timeout_s: float = 180.0
    """Seconds to wait for each phase (apiserver ready, node Ready) before giving up."""
    namespace: str = NAMESPACE
    token_expiration_s: int = 86400
    """Lifetime of the service-account token written to rankpack-sa.kubeconfig."""
    nodes: int = 1
    """How many nodes (kubelets) share this machine's CPUs."""


@dataclass(frozen=True)
class UpResult:
    already_up: bool
    version: str
    kubeconfig: Path
    service_account_kubeconfig: Path
    state_dir: Path
    elapsed_s: float
    nodes: tuple[str, ...] = ()


@dataclass
class DownReport:
    was_up: bool
    stopped_pids: list[int] = field(default_factory=list)
    unmounted: int = 0
    removed_cgroups: list[str] = field(default_factory=list)
    removed_paths: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UserError(
            "rankpack dev-cluster must run as root (it starts a kubelet, mounts, creates "
            "cgroups and a network address)"
        )


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    layout.lock.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"another `rankpack dev-cluster` command holds {layout.lock}; wait for it"
            ) from None
        yield


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


def _node_named(layout: Layout, name: str) -> NodeSpec:
    nodes = layout.recorded_nodes()
    for spec in nodes:
        if spec.name == name:
            return spec
    if not nodes:
        raise UserError(f"no dev cluster in {layout.root}; run `rankpack dev-cluster up` first")
    raise UserError(f"no node {name}; the nodes are {', '.join(n.name for n in nodes)}")


def _recorded_version(layout: Layout) -> str | None:
    try:
        return layout.version_file.read_text().strip()
    except OSError:
        return None


def _ports_taken(nodes: list[NodeSpec] | None = None) -> list[str]:
    taken = []
    ports = dict(PORTS)
    for spec in nodes or []:
        ports.update(spec.ports)
    for port, what in sorted(ports.items()):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                taken.append(f"{port} ({what})")
    return taken


def preflight(layout: Layout, nodes: list[NodeSpec] | None = None) -> None:
    """Refuse (one line, exit 2) when the machine cannot host the cluster right now."""
    _require_root()
    missing = packages.missing_packages()
    if missing:
        raise UserError(packages.install_hint(missing))
    foreign = [f"{name} (pid {pid})" for pid, name in processes.by_name(FOREIGN_DAEMONS)]
    if foreign:
        raise UserError(
            "another cluster or container runtime is running: "
            + ", ".join(foreign)
            + "; stop it first (two clusters cannot share the fixed ports)"
        )
    existing = host.kubepods_cgroups() + host.cluster_cgroups()
    if existing:
        raise UserError(
            f"{existing[0]} exists: another kubelet (kubepods) or dev cluster ran here; stop it "
            "(or remove its cgroups)"
        )
    taken = _ports_taken(nodes)
    if taken:
        raise UserError(f"ports in use: {', '.join(taken)}; stop what listens there")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _wait(what: str, check: Callable[[], bool], timeout_s: float, layout: Layout, log: str) -> None:
    """Poll `check` until true; fail early if a component died, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [c for c in _started(layout) if processes.read_pid(layout.pid_for(c)) is None]
        if dead:
            raise UserError(
                f"{dead[0]} exited while waiting for {what}; see {layout.log_for(dead[0])}"
            )
        time.sleep(0.25)
    raise UserError(f"timed out after {timeout_s:.0f} s waiting for {what}; see {log}")


def _started(layout: Layout) -> list[str]:
    return [c for c in layout.components() if layout.pid_for(c).exists()]


def _http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _api_client(kubeconfig: Path) -> ClientKubeApi:
    """The admin's REST client (cluster-scoped calls; bounded, so a booting apiserver that
    hangs is one that does not answer)."""
    return ClientKubeApi(KubernetesConfig(kubeconfig=kubeconfig, namespace=NAMESPACE),
                         request_timeout_s=10.0)  # fmt: skip


def _node_ready(api: ClientKubeApi, name: str) -> bool:
    try:
        node = api.request("GET", f"/api/v1/nodes/{name}")
    except ApiError:  # not registered yet, or the apiserver is still booting
        return False
    return readings.node_ready(node)


def _default_service_account(api: ClientKubeApi, namespace: str) -> bool:
    try:
        api.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
    except ApiError:
        return False
    return True


def _write_service_account_kubeconfig(layout: Layout, opts: UpOptions) -> None:
    api = _api_client(layout.admin_kubeconfig)
    ca_pem = (layout.pki / "ca.crt").read_text()
    cfg = rbac.service_account_kubeconfig(
        api,
        server=configs.api_server_url(),
        ca_pem=ca_pem,
        namespace=opts.namespace,
        expiration_s=opts.token_expiration_s,
    )
    _write(layout.service_account_kubeconfig, configs.dumps(cfg), 0o600)


def _daemon_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "GO"))}
    path = env.get("PATH", "/usr/bin:/bin")
    env["PATH"] = ":".join(
        dict.fromkeys(["/usr/local/sbin", "/usr/sbin", "/sbin", *path.split(":")])
    )
    return env


def _nodes_for(opts: UpOptions) -> list[NodeSpec]:
    return node_specs(opts.nodes, host.host_cpus())


def up(opts: UpOptions, say: Callable[[str], None] = print) -> UpResult:
    """Stand the cluster up (or report that it is up). Raises UserError on any refusal."""
    started_at = time.monotonic()
    layout = Layout(opts.state_dir)
    specs = _nodes_for(opts)  # first: a --nodes this machine cannot hold is refused as is
    _require_root()
    with _locked(layout):
        live = running_components(layout)
        if live:
            recorded = _recorded_version(layout) or "?"
            if not layout.recorded_nodes():
                raise UserError(
                    "a dev cluster of an older rankpack (no recorded nodes) is up; run "
                    "`rankpack dev-cluster down` first"
                )
            missing = [c for c in expected_components(layout) if c not in live]
            if missing:
                raise UserError(
                    f"the dev cluster is half up ({', '.join(missing)} not running); "
                    "run `rankpack dev-cluster down` first"
                )
            if recorded != opts.version.tag:
                raise UserError(
                    f"a dev cluster {recorded} is up; `rankpack dev-cluster down` before "
                    f"starting {opts.version.tag}"
                )
            nodes = layout.recorded_nodes()
            if len(nodes) != len(specs):
                raise UserError(
                    f"a dev cluster of {len(nodes)} node(s) is up; `rankpack dev-cluster down` "
                    f"before starting one of {len(specs)}"
                )
            api = _api_client(layout.admin_kubeconfig)
            rbac.apply(api, opts.namespace)  # a newer rankpack may need more (or less)
            rbac.apply_crd(api)
            _write_service_account_kubeconfig(layout, opts)
            return UpResult(
                True,
                recorded,
                layout.admin_kubeconfig,
                layout.service_account_kubeconfig,
                layout.root,
                time.monotonic() - started_at,
                tuple(n.name for n in nodes),
            )
        if layout.host_record.exists():
            say("rankpack: cleaning up what a previous dev cluster left behind")
            _teardown(layout)
        preflight(layout, specs)
        bin_dir = binaries.ensure(opts.version)
        try:
            _start(layout, opts, specs, bin_dir, say)
        except BaseException as exc:
            say(f"rankpack: start failed; taking down what was started (logs: {layout.logs})")
            _teardown(layout)
            if isinstance(exc, UserError | KeyboardInterrupt | SystemExit):
                raise
            first_line = (str(exc).splitlines() or [""])[0][:200]
            raise UserError(
                f"the dev cluster did not start ({type(exc).__name__}: {first_line}); "
                f"see the logs in {layout.logs}"
            ) from exc
    return UpResult(
        False,
        opts.version.tag,
        layout.admin_kubeconfig,
        layout.service_account_kubeconfig,
        layout.root,
        time.monotonic() - started_at,
        tuple(n.name for n in specs),
    )


def _prepare_state(layout: Layout, opts: UpOptions, specs: list[NodeSpec]) -> pki.Credentials:
    if layout.root.exists() and not host.safe_rmtree(layout.root):
        raise UserError(f"cannot clear {layout.root}: something is still mounted below it")
    layout.root.mkdir(parents=True, mode=0o700)
    _write(layout.host_record, json.dumps(host.record(), indent=2) + "\n")
    _write(layout.nodes_file, json.dumps({"nodes": [n.to_json() for n in specs]}, indent=2))
    _write(layout.version_file, opts.version.tag + "\n")
    creds = pki.generate(layout.pki, specs)
    _write(layout.tokens_file, configs.token_file(creds.identities), 0o600)
    server = configs.api_server_url()

    def kubeconfig(path: Path, ident: configs.Identity) -> None:
        cfg = configs.kubeconfig(
            server=server, ca_pem=creds.ca_pem, user=ident.user, token=ident.token
        )
        _write(path, configs.dumps(cfg), 0o600)

    kubeconfig(layout.admin_kubeconfig, creds.admin)
    kubeconfig(layout.kubeconfig_for("kube-controller-manager"), creds.controller_manager)
    kubeconfig(layout.kubeconfig_for("kube-scheduler"), creds.scheduler)
    for spec in specs:
        node = layout.node(spec)
        kubeconfig(node.kubelet_kubeconfig, creds.kubelets[spec.name])
        _write(node.containerd_config, configs.containerd_config(node, packages.tool("runc")))
        _write(
            node.cni_conf_dir / "10-rankpack.conflist", configs.dumps(configs.cni_conflist(node))
        )
        _write(node.kubelet_config, configs.dumps(configs.kubelet_config(layout, node)))
        _write(node.cpu_online, format_cpus(spec.cpus) + "\n")
        node.kubelet_pki.mkdir(parents=True, exist_ok=True)
    for d in (layout.logs, layout.pids, layout.images):
        d.mkdir(parents=True, exist_ok=True)
    return creds


def _start_runtime(
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


def _start_kubelet(
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


def _prepare_host(layout: Layout, specs: list[NodeSpec]) -> list[Path]:
    """Addresses, routes, cgroups, the namespaces' directory and the fixed paths' mount
    points; returns the daemons' ``cgroup.procs`` files."""
    host.add_address(SERVICE_FIRST_IP)
    for spec in specs:
        host.add_address(spec.ip)
    for network in UNREACHABLE_ROUTES:
        host.add_unreachable_route(network)
    system = host.make_system_cgroup()
    for spec in specs:
        host.make_node_cgroup(spec)
    host.prepare_namespace_dir(layout.namespaces)
    for fixed, _name in NODE_BINDS:
        os.makedirs(fixed, exist_ok=True)
    return system


def _start(
    layout: Layout,
    opts: UpOptions,
    specs: list[NodeSpec],
    bin_dir: Path,
    say: Callable[[str], None],
) -> None:
    creds = _prepare_state(layout, opts, specs)
    system = _prepare_host(layout, specs)
    env = _daemon_env()
    timeout = opts.ready_timeout_s
    nodes = [layout.node(s) for s in specs]

    def launch(name: str, argv: list[str]) -> None:
        processes.start(argv, layout.log_for(name), layout.pid_for(name), env, system)

    say(f"rankpack: starting etcd and {len(nodes)} containerd (state {layout.root})")
    launch("etcd", configs.etcd_argv(layout, packages.tool("etcd")))
    for node in nodes:
        _start_runtime(layout, node, env, system)
    _wait(
        "etcd",
        lambda: _http_ok("http://127.0.0.1:2379/health"),
        timeout,
        layout,
        str(layout.log_for("etcd")),
    )
    launch("kube-apiserver", configs.apiserver_argv(layout, bin_dir))
    say("rankpack: building the pause and host-usr images and importing them into each node")
    images.build(layout)
    for node in nodes:
        _wait(
            f"containerd of {node.name}",
            node.containerd_socket.exists,
            timeout,
            layout,
            str(layout.log_for(node.spec.component("containerd"))),
        )
        images.import_all(layout, node)
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    _wait(
        "kube-apiserver /readyz",
        lambda: _http_ok("https://127.0.0.1:6443/readyz", ctx, creds.admin.token),
        timeout,
        layout,
        str(layout.log_for("kube-apiserver")),
    )
    # pods reach the apiserver at the kubernetes Service's address: the relay stands in
    # for kube-proxy there (see `rankpack.devcluster.relay`)
    launch("service-relay", configs.relay_argv(layout))
    say(f"rankpack: starting controller-manager, scheduler and {len(nodes)} kubelet")
    launch("kube-controller-manager", configs.controller_manager_argv(layout, bin_dir))
    launch("kube-scheduler", configs.scheduler_argv(layout, bin_dir))
    for node in nodes:
        _start_kubelet(layout, node, bin_dir, env, system)
    api = _api_client(layout.admin_kubeconfig)
    for node in nodes:
        _wait(
            f"node {node.name} Ready",
            functools.partial(_node_ready, api, node.name),
            timeout,
            layout,
            str(layout.log_for(node.spec.component("kubelet"))),
        )
    rbac.apply(api, opts.namespace)
    rbac.apply_crd(api)
    _wait(
        f"the default ServiceAccount in namespace {opts.namespace}",
        lambda: _default_service_account(api, opts.namespace),
        timeout,
        layout,
        str(layout.log_for("kube-controller-manager")),
    )
    _write_service_account_kubeconfig(layout, opts)


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


def _reap(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _node_cgroups(spec: NodeSpec) -> list[Path]:
    return [h / spec.cgroup_root for h in host.hierarchies() if (h / spec.cgroup_root).is_dir()]


def _crash(layout: Layout, node: NodeLayout, timeout_s: float = 20) -> list[int]:
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
    _reap(killed)
    for kind in NODE_COMPONENTS:
        with contextlib.suppress(OSError):
            layout.pid_for(node.spec.component(kind)).unlink()
    host.drop_node_namespace(node.mount_namespace)
    host.remove_bridge(node.spec.bridge)
    return killed


def _teardown(layout: Layout) -> DownReport:
    try:
        record: dict[str, Any] = json.loads(layout.host_record.read_text())
    except (OSError, ValueError):
        record = {}
    report = DownReport(was_up=bool(running_components(layout)))
    existing_kubepods = set(record.get("existing_kubepods", []))
    existing_cgroups = set(record.get("existing_cgroups", []))
    nodes = [layout.node(spec) for spec in layout.recorded_nodes()]

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
        report.stopped_pids += _crash(layout, node)
    for name in ("containerd", "service-relay", "kube-apiserver", "etcd"):
        pid = processes.read_pid(layout.pid_for(name))
        if pid is not None:
            report.stopped_pids.append(pid)
            processes.stop([pid])
    stray = _our_processes(layout)
    report.stopped_pids += stray
    processes.stop(stray, timeout_s=5)
    _reap(report.stopped_pids)

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

    # Keep the logs for a post-mortem (the next `up` clears them); remove the rest.
    if layout.root.exists():
        for entry in layout.root.iterdir():
            if entry == layout.logs:
                continue
            host.safe_rmtree(entry)
    report.leftovers = leftovers(layout, record, nodes=[n.spec for n in nodes])
    return report


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


def down(state_dir: Path) -> DownReport:
    """Stop everything `up` started and remove everything it created, then verify."""
    _require_root()
    layout = Layout(state_dir)
    with _locked(layout):
        if not layout.host_record.exists() and not running_components(layout):
            return DownReport(was_up=False)
        report = _teardown(layout)
        with contextlib.suppress(OSError):
            layout.lock.unlink()
    return report


def status(state_dir: Path) -> dict[str, Any]:
    """The cluster as `status --json` reports it."""
    layout = Layout(state_dir)
    if layout.root.exists() and not os.access(layout.root, os.R_OK | os.X_OK):
        raise UserError(f"cannot read {layout.root}: run `rankpack dev-cluster status` as root")
    live = running_components(layout)
    version = _recorded_version(layout)
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
        api = _api_client(layout.admin_kubeconfig)
        api_nodes = {n["metadata"]["name"]: n for n in api.list_nodes()}
    except BackendError as exc:  # the apiserver may be starting or gone: report, not crash
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return result
    for name in [*specs, *(n for n in api_nodes if n not in specs)]:
        node = api_nodes.get(name, {})
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
        result["nodes"].append(entry)
    result["ready"] = bool(result["nodes"]) and all(n["ready"] for n in result["nodes"])
    return result


# -- one node crashed and brought back (fault tests: a node lost) -----------------------


@dataclass(frozen=True)
class NodeStopped:
    name: str
    killed_pids: list[int]


def stop_node(state_dir: Path, name: str) -> NodeStopped:
    """A node crash: SIGKILL to its kubelet, containerd, shims and every process of its pods;
    its mount namespace and pod network (bridge, veths, network namespaces) gone. Its Node
    object, address and cgroup root stay (the control plane sees the node stop answering)."""
    _require_root()
    layout = Layout(state_dir)
    with _locked(layout):
        spec = _node_named(layout, name)
        node = layout.node(spec)
        killed = _crash(layout, node)
        node.stopped_marker.touch()
    return NodeStopped(name, killed)


def start_node(state_dir: Path, name: str, timeout_s: float = 180.0) -> float:
    """Bring a stopped node back empty: its containers' state, pod directories, IPAM and
    cgroups removed, a new namespace, containerd (with the images) and kubelet; waits
    (bounded) until the node is Ready. Returns the seconds that took; 0 if it ran."""
    _require_root()
    started = time.monotonic()
    layout = Layout(state_dir)
    with _locked(layout):
        spec = _node_named(layout, name)
        node = layout.node(spec)
        if not all(c in running_components(layout) for c in CONTROL_PLANE):
            raise UserError("the control plane is not running; `rankpack dev-cluster up` first")
        if processes.read_pid(layout.pid_for(spec.component("kubelet"))) is not None:
            return 0.0
        _crash(layout, node)  # whatever is left of it (a kubelet that died alone)
        for cg in _node_cgroups(spec):
            if not host.remove_cgroup_tree(cg):
                raise UserError(f"cannot remove {cg}: something still runs there")
        host.make_node_cgroup(spec)
        if node.runtime.exists() and not host.safe_rmtree(node.runtime):
            raise UserError(f"cannot clear {node.runtime}: something is mounted below it")
        host.prepare_namespace_dir(layout.namespaces)
        env, system = _daemon_env(), host.make_system_cgroup()
        _start_runtime(layout, node, env, system)
        log = str(layout.log_for(spec.component("containerd")))
        _wait(f"containerd of {name}", node.containerd_socket.exists, timeout_s, layout, log)
        images.import_all(layout, node)
        version = KubeVersion.parse(_recorded_version(layout) or binaries.DEFAULT_VERSION)
        _start_kubelet(layout, node, binaries.bin_dir(version), env, system)
        api = _api_client(layout.admin_kubeconfig)
        _wait(
            f"node {name} Ready",
            lambda: _node_ready(api, name),
            timeout_s,
            layout,
            str(layout.log_for(spec.component("kubelet"))),
        )
        node.stopped_marker.unlink(missing_ok=True)
    return time.monotonic() - started


# -- one component stopped and started again (fault tests: the apiserver restarting) -------

RESTARTABLE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def _restartable(layout: Layout, name: str) -> None:
    if name not in RESTARTABLE:
        raise UserError(f"cannot restart {name} alone; one of {', '.join(RESTARTABLE)}")
    if not layout.host_record.exists():
        raise UserError(f"no dev cluster in {layout.root}; run `rankpack dev-cluster up` first")


def stop_component(state_dir: Path, name: str) -> bool:
    """Stop one control-plane component of a running cluster (SIGTERM, bounded, SIGKILL);
    False if it was not running. Everything else keeps running (pods, kubelet, etcd)."""
    _require_root()
    layout = Layout(state_dir)
    _restartable(layout, name)
    pid = processes.read_pid(layout.pid_for(name))
    if pid is None:
        return False
    left = processes.stop([pid])
    _reap([pid])
    if left:
        raise UserError(f"{name} (pid {pid}) did not stop")
    return True


def start_component(state_dir: Path, name: str, timeout_s: float = 120.0) -> int:
    """Start a component `stop_component` stopped, with the argv `up` used, and wait
    (bounded) until it serves again (the apiserver: /readyz). Returns its pid."""
    _require_root()
    layout = Layout(state_dir)
    _restartable(layout, name)
    pid = processes.read_pid(layout.pid_for(name))
    if pid is not None:
        return pid
    version = KubeVersion.parse(_recorded_version(layout) or binaries.DEFAULT_VERSION)
    bin_dir = binaries.bin_dir(version)
    argv = {
        "kube-apiserver": configs.apiserver_argv,
        "kube-controller-manager": configs.controller_manager_argv,
        "kube-scheduler": configs.scheduler_argv,
    }[name](layout, bin_dir)
    pid = processes.start(argv, layout.log_for(name), layout.pid_for(name), _daemon_env())
    if name == "kube-apiserver":
        ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
        token = _admin_token(layout)
        _wait(
            "kube-apiserver /readyz",
            lambda: _http_ok("https://127.0.0.1:6443/readyz", ctx, token),
            timeout_s,
            layout,
            str(layout.log_for(name)),
        )
    return pid


def _admin_token(layout: Layout) -> str | None:
    try:  # configs.dumps writes kubeconfigs as JSON (a subset of YAML)
        cfg = json.loads(layout.admin_kubeconfig.read_text())
        return str(cfg["users"][0]["user"]["token"])
    except (OSError, KeyError, IndexError, TypeError, ValueError):
        return None
