"""`up`, `down` and `status` of the single-node dev cluster.

Called by `rankpack.cli.devcluster_cmd` and by the `k8s` test tier's session fixture
(`tests/k8s/conftest.py`). `up` checks the machine (root, packages, ports, no other
cluster), builds or reuses the cached binaries, generates certificates and configs, adds the
node address, starts etcd, containerd, the control plane and the kubelet detached, builds
and imports the local images, waits (bounded) for the node to be Ready and applies the
backend's namespace and RBAC. `down` undoes every one of those steps and then checks that
nothing is left; it only removes what `up` recorded as created by it.
"""

from __future__ import annotations

import contextlib
import fcntl
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

from rankpack.backend.kubernetes import status as readings
from rankpack.backend.kubernetes.api import ApiError, ClientKubeApi
from rankpack.backend.kubernetes.config import KubernetesConfig
from rankpack.backend.protocol import BackendError
from rankpack.devcluster import binaries, configs, host, images, packages, pki, processes, rbac
from rankpack.devcluster.binaries import KubeVersion
from rankpack.devcluster.layout import (
    BRIDGE,
    COMPONENTS,
    HOST_PATHS,
    NAMESPACE,
    NODE_IP,
    NODE_NAME,
    PORTS,
    SERVICE_FIRST_IP,
    Layout,
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


@dataclass(frozen=True)
class UpResult:
    already_up: bool
    version: str
    kubeconfig: Path
    service_account_kubeconfig: Path
    state_dir: Path
    elapsed_s: float


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
    for name in COMPONENTS:
        pid = processes.read_pid(layout.pid_for(name))
        if pid is not None:
            found[name] = pid
    return found


def _recorded_version(layout: Layout) -> str | None:
    try:
        return layout.version_file.read_text().strip()
    except OSError:
        return None


def _ports_taken() -> list[str]:
    taken = []
    for port, what in PORTS.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                taken.append(f"{port} ({what})")
    return taken


def preflight(layout: Layout) -> None:
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
    existing = host.kubepods_cgroups()
    if existing:
        raise UserError(
            f"{existing[0]} exists: another kubelet ran here; stop it (or remove its cgroups)"
        )
    taken = _ports_taken()
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
    return [c for c in COMPONENTS if layout.pid_for(c).exists()]


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


def _node_ready(api: ClientKubeApi) -> bool:
    try:
        node = api.request("GET", f"/api/v1/nodes/{NODE_NAME}")
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


def up(opts: UpOptions, say: Callable[[str], None] = print) -> UpResult:
    """Stand the cluster up (or report that it is up). Raises UserError on any refusal."""
    started_at = time.monotonic()
    layout = Layout(opts.state_dir)
    _require_root()
    with _locked(layout):
        live = running_components(layout)
        if live:
            recorded = _recorded_version(layout) or "?"
            if len(live) < len(COMPONENTS):
                missing = sorted(set(COMPONENTS) - set(live))
                raise UserError(
                    f"the dev cluster is half up ({', '.join(missing)} not running); "
                    "run `rankpack dev-cluster down` first"
                )
            if recorded != opts.version.tag:
                raise UserError(
                    f"a dev cluster {recorded} is up; `rankpack dev-cluster down` before "
                    f"starting {opts.version.tag}"
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
            )
        if layout.host_record.exists():
            say("rankpack: cleaning up what a previous dev cluster left behind")
            _teardown(layout)
        preflight(layout)
        bin_dir = binaries.ensure(opts.version)
        try:
            _start(layout, opts, bin_dir, say)
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
    )


def _prepare_state(layout: Layout, opts: UpOptions) -> pki.Credentials:
    if layout.root.exists() and not host.safe_rmtree(layout.root):
        raise UserError(f"cannot clear {layout.root}: something is still mounted below it")
    layout.root.mkdir(parents=True, mode=0o700)
    _write(layout.host_record, json.dumps(host.record(), indent=2) + "\n")
    _write(layout.version_file, opts.version.tag + "\n")
    creds = pki.generate(layout.pki)
    _write(layout.tokens_file, configs.token_file(creds.identities), 0o600)
    server = configs.api_server_url()
    for name, ident in (
        ("admin", creds.admin),
        ("kubelet", creds.kubelet),
        ("kube-controller-manager", creds.controller_manager),
        ("kube-scheduler", creds.scheduler),
    ):
        cfg = configs.kubeconfig(
            server=server, ca_pem=creds.ca_pem, user=ident.user, token=ident.token
        )
        path = layout.admin_kubeconfig if name == "admin" else layout.kubeconfig_for(name)
        _write(path, configs.dumps(cfg), 0o600)
    _write(layout.containerd_config, configs.containerd_config(layout, packages.tool("runc")))
    _write(
        layout.cni_conf_dir / "10-rankpack.conflist", configs.dumps(configs.cni_conflist(layout))
    )
    _write(layout.kubelet_config, configs.dumps(configs.kubelet_config(layout)))
    for d in (layout.logs, layout.pids, layout.pod_logs, layout.kubelet_root, layout.cni_data_dir):
        d.mkdir(parents=True, exist_ok=True)
    return creds


def _start(layout: Layout, opts: UpOptions, bin_dir: Path, say: Callable[[str], None]) -> None:
    creds = _prepare_state(layout, opts)
    host.add_node_address()
    host.add_address(SERVICE_FIRST_IP)
    env = _daemon_env()
    timeout = opts.ready_timeout_s

    def launch(name: str, argv: list[str]) -> None:
        processes.start(argv, layout.log_for(name), layout.pid_for(name), env)

    say(f"rankpack: starting etcd and containerd (state {layout.root})")
    launch("etcd", configs.etcd_argv(layout, packages.tool("etcd")))
    launch("containerd", configs.containerd_argv(layout, packages.tool("containerd")))
    _wait(
        "etcd",
        lambda: _http_ok("http://127.0.0.1:2379/health"),
        timeout,
        layout,
        str(layout.log_for("etcd")),
    )
    launch("kube-apiserver", configs.apiserver_argv(layout, bin_dir))
    _wait("containerd", layout.containerd_socket.exists, timeout, layout, str(layout.logs))
    say("rankpack: building and importing the pause and host-usr images")
    images.build_and_import(layout)
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
    say("rankpack: starting controller-manager, scheduler and kubelet")
    launch("kube-controller-manager", configs.controller_manager_argv(layout, bin_dir))
    launch("kube-scheduler", configs.scheduler_argv(layout, bin_dir))
    launch("kubelet", configs.kubelet_argv(layout, bin_dir))
    api = _api_client(layout.admin_kubeconfig)
    _wait(
        f"node {NODE_NAME} Ready",
        lambda: _node_ready(api),
        timeout,
        layout,
        str(layout.log_for("kubelet")),
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


def _teardown(layout: Layout) -> DownReport:
    try:
        record: dict[str, Any] = json.loads(layout.host_record.read_text())
    except (OSError, ValueError):
        record = {}
    report = DownReport(was_up=bool(running_components(layout)))
    existing_kubepods = set(record.get("existing_kubepods", []))

    # The kubelet first, so that it restarts nothing; then the containers (everything in the
    # kubepods cgroups) and their shims; then the rest in reverse start order.
    order = ["kubelet", "kube-scheduler", "kube-controller-manager"]
    for name in order:
        pid = processes.read_pid(layout.pid_for(name))
        if pid is not None:
            report.stopped_pids.append(pid)
            processes.stop([pid])
    for cg in host.kubepods_cgroups():
        if str(cg) not in existing_kubepods:
            for pid in host.cgroup_pids(cg):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
    shims = processes.shims_of(layout.containerd_socket)
    report.stopped_pids += shims
    processes.stop(shims, timeout_s=5)
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
    mount_roots = [str(layout.root), "/var/lib/kubelet", "/run/containerd", "/run/netns"]
    mount_roots += [p for p in ("/var/run/netns",) if not os.path.islink("/var/run")]
    before = len(host.mounts_under(mount_roots))
    left_mounts = host.unmount_all(mount_roots)
    report.unmounted = before - len(left_mounts)

    for cg in host.kubepods_cgroups():
        if str(cg) not in existing_kubepods and host.remove_cgroup_tree(cg):
            report.removed_cgroups.append(str(cg))

    for ifname in _bridge_ports():
        host.run_ip(["link", "del", ifname])
    if not record.get("bridge_present", False):
        host.remove_bridge()
    if not record.get("node_address_present", True):
        host.remove_node_address()
    if not record.get("service_address_present", True):
        host.remove_address(SERVICE_FIRST_IP)
    host.restore_sysctls(record.get("sysctls", {}))

    left_paths = host.remove_paths(created_paths)
    report.removed_paths = [p for p in created_paths if p not in left_paths]

    # Keep the logs for a post-mortem (the next `up` clears them); remove the rest.
    if layout.root.exists():
        for entry in layout.root.iterdir():
            if entry == layout.logs:
                continue
            host.safe_rmtree(entry)
    report.leftovers = leftovers(layout, record)
    return report


def _bridge_ports() -> list[str]:
    ports = []
    net = Path("/sys/class/net")
    for dev in net.iterdir() if net.is_dir() else []:
        master = dev / "master"
        if master.is_symlink() and os.path.basename(os.readlink(master)) == BRIDGE:
            ports.append(dev.name)
    return ports


def leftovers(layout: Layout, record: dict[str, Any]) -> list[str]:
    """What a cluster could leave behind and still exists: empty after a clean `down`."""
    found = [
        f"process {pid}: {' '.join(processes.cmdline(pid))[:80]}" for pid in _our_processes(layout)
    ]
    mount_roots = [str(layout.root), "/var/lib/kubelet", "/run/containerd", "/run/netns"]
    found += [f"mount {m}" for m in host.mounts_under(mount_roots)]
    existing = set(record.get("existing_kubepods", []))
    found += [f"cgroup {cg}" for cg in host.kubepods_cgroups() if str(cg) not in existing]
    if host.node_address_present() and not record.get("node_address_present", False):
        found.append(f"address {NODE_IP}/32 on lo")
    if host.service_address_present() and not record.get("service_address_present", False):
        found.append(f"address {SERVICE_FIRST_IP}/32 on lo")
    if host.link_exists(BRIDGE) and not record.get("bridge_present", False):
        found.append(f"network device {BRIDGE}")
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
        "running": sorted(live, key=COMPONENTS.index),
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
    if len(live) < len(COMPONENTS) or not os.access(layout.admin_kubeconfig, os.R_OK):
        return result
    try:
        api = _api_client(layout.admin_kubeconfig)
        nodes = api.list_nodes()
    except BackendError as exc:  # the apiserver may be starting or gone: report, not crash
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return result
    for node in nodes:
        result["nodes"].append(
            {
                "name": node["metadata"]["name"],
                "ready": readings.node_ready(node),
                "allocatable_millis": readings.node_allocatable_millis(node),
                "kubelet_version": node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion"),
            }
        )
    result["ready"] = bool(result["nodes"]) and all(n["ready"] for n in result["nodes"])
    return result


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
