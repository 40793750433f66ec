"""`up`: stand the dev cluster up, or report (and refresh) the one that is up.

Called by `rankpack.cli.devcluster_cmd` and by the `k8s` test tier's fixtures
(`tests/k8s/conftest.py`). `up` checks the machine (`preflight`), builds or reuses the
cached binaries, generates certificates and configs, adds the node and Service addresses
and the unreachable routes, creates the daemons' cgroup and each node's cgroup root (its
share of the CPUs) and mount namespace, starts etcd, the control plane and each node's
containerd and kubelet detached (`nodes`), builds the local images and imports them into
every node, waits (bounded, `probes`) for every node to be Ready and applies the backend's
namespace and RBAC. A start that fails is taken down again (`teardown`).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rankpack.devcluster import binaries, configs, host, images, packages, pki, processes, rbac
from rankpack.devcluster.binaries import KubeVersion
from rankpack.devcluster.layout import (
    NAMESPACE,
    NODE_BINDS,
    SERVICE_FIRST_IP,
    UNREACHABLE_ROUTES,
    Layout,
    NodeLayout,
    NodeSpec,
    format_cpus,
    node_specs,
)
from rankpack.devcluster.lifecycle.clusterstate import (
    expected_components,
    recorded_version,
    running_components,
)
from rankpack.devcluster.lifecycle.nodes import start_kubelet, start_runtime
from rankpack.devcluster.lifecycle.preflight import check_machine, locked, require_root
from rankpack.devcluster.lifecycle.probes import (
    api_client,
    apiserver_ready,
    default_service_account,
    http_ok,
    node_ready,
    wait_for,
)
from rankpack.devcluster.lifecycle.teardown import teardown
from rankpack.errors import UserError


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


def up(opts: UpOptions, say: Callable[[str], None] = print) -> UpResult:
    """Stand the cluster up (or report that it is up). Raises UserError on any refusal."""
    started_at = time.monotonic()
    layout = Layout(opts.state_dir)
    # first: a --nodes this machine cannot hold is refused as is
    specs = node_specs(opts.nodes, host.host_cpus())
    require_root()
    with locked(layout):
        live = running_components(layout)
        if live:
            return _already_up(layout, opts, specs, live, started_at)
        if layout.host_record.exists():
            say("rankpack: cleaning up what a previous dev cluster left behind")
            teardown(layout)
        check_machine(specs)
        bin_dir = binaries.ensure(opts.version)
        try:
            _start(layout, opts, specs, bin_dir, say)
        except BaseException as exc:
            say(f"rankpack: start failed; taking down what was started (logs: {layout.logs})")
            teardown(layout)
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


def _already_up(
    layout: Layout, opts: UpOptions, specs: list[NodeSpec], live: dict[str, int], started_at: float
) -> UpResult:
    """The cluster that is up, if it is the one asked for: its RBAC applied again (a newer
    rankpack may need more, or less) and its ServiceAccount token refreshed."""
    recorded = recorded_version(layout) or "?"
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
    api = api_client(layout.admin_kubeconfig)
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


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _write_service_account_kubeconfig(layout: Layout, opts: UpOptions) -> None:
    api = api_client(layout.admin_kubeconfig)
    ca_pem = (layout.pki / "ca.crt").read_text()
    cfg = rbac.service_account_kubeconfig(
        api,
        server=configs.api_server_url(),
        ca_pem=ca_pem,
        namespace=opts.namespace,
        expiration_s=opts.token_expiration_s,
    )
    _write(layout.service_account_kubeconfig, configs.dumps(cfg), 0o600)


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
    env = processes.daemon_env()
    timeout = opts.ready_timeout_s
    nodes = [layout.node(s) for s in specs]

    def launch(name: str, argv: list[str]) -> None:
        processes.start(argv, layout.log_for(name), layout.pid_for(name), env, system)

    say(f"rankpack: starting etcd and {len(nodes)} containerd (state {layout.root})")
    launch("etcd", configs.etcd_argv(layout, packages.tool("etcd")))
    for node in nodes:
        start_runtime(layout, node, env, system)
    wait_for(
        "etcd",
        lambda: http_ok("http://127.0.0.1:2379/health"),
        timeout,
        layout,
        str(layout.log_for("etcd")),
    )
    launch("kube-apiserver", configs.apiserver_argv(layout, bin_dir))
    say("rankpack: building the pause and host-usr images and importing them into each node")
    images.build(layout)
    for node in nodes:
        wait_for(
            f"containerd of {node.name}",
            node.containerd_socket.exists,
            timeout,
            layout,
            str(layout.log_for(node.spec.component("containerd"))),
        )
        images.import_all(layout, node)
    wait_for(
        "kube-apiserver /readyz",
        apiserver_ready(layout, creds.admin.token),
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
        start_kubelet(layout, node, bin_dir, env, system)
    _wait_ready(layout, opts, nodes)


def _wait_ready(layout: Layout, opts: UpOptions, nodes: list[NodeLayout]) -> None:
    """Every node Ready, then the backend's namespace, RBAC and CRD applied and its
    ServiceAccount's kubeconfig written."""
    timeout = opts.ready_timeout_s
    api = api_client(layout.admin_kubeconfig)
    for node in nodes:
        wait_for(
            f"node {node.name} Ready",
            functools.partial(node_ready, api, node.name),
            timeout,
            layout,
            str(layout.log_for(node.spec.component("kubelet"))),
        )
    rbac.apply(api, opts.namespace)
    rbac.apply_crd(api)
    wait_for(
        f"the default ServiceAccount in namespace {opts.namespace}",
        lambda: default_service_account(api, opts.namespace),
        timeout,
        layout,
        str(layout.log_for("kube-controller-manager")),
    )
    _write_service_account_kubeconfig(layout, opts)
