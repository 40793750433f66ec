"""One control-plane component stopped and started again, the rest of the cluster left
running (fault tests: the apiserver restarting).

Called by the `k8s` test tier (`tests/k8s/test_api_requests.py`,
`tests/k8s/test_operator_faults.py`); no command-line action.
"""

from __future__ import annotations

from pathlib import Path

from rankpack.devcluster import binaries, configs, processes
from rankpack.devcluster.binaries import KubeVersion
from rankpack.devcluster.layout import Layout
from rankpack.devcluster.lifecycle.clusterstate import recorded_version
from rankpack.devcluster.lifecycle.preflight import require_root
from rankpack.devcluster.lifecycle.probes import admin_token, apiserver_ready, wait_for
from rankpack.errors import UserError

RESTARTABLE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def _restartable(layout: Layout, name: str) -> None:
    if name not in RESTARTABLE:
        raise UserError(f"cannot restart {name} alone; one of {', '.join(RESTARTABLE)}")
    if not layout.host_record.exists():
        raise UserError(f"no dev cluster in {layout.root}; run `rankpack dev-cluster up` first")


def stop_component(state_dir: Path, name: str) -> bool:
    """Stop one control-plane component of a running cluster (SIGTERM, bounded, SIGKILL);
    False if it was not running. Everything else keeps running (pods, kubelet, etcd)."""
    require_root()
    layout = Layout(state_dir)
    _restartable(layout, name)
    pid = processes.read_pid(layout.pid_for(name))
    if pid is None:
        return False
    left = processes.stop([pid])
    processes.reap([pid])
    if left:
        raise UserError(f"{name} (pid {pid}) did not stop")
    return True


def start_component(state_dir: Path, name: str, timeout_s: float = 120.0) -> int:
    """Start a component `stop_component` stopped, with the argv `up` used, and wait
    (bounded) until it serves again (the apiserver: /readyz). Returns its pid."""
    require_root()
    layout = Layout(state_dir)
    _restartable(layout, name)
    pid = processes.read_pid(layout.pid_for(name))
    if pid is not None:
        return pid
    version = KubeVersion.parse(recorded_version(layout) or binaries.DEFAULT_VERSION)
    bin_dir = binaries.bin_dir(version)
    argv = {
        "kube-apiserver": configs.apiserver_argv,
        "kube-controller-manager": configs.controller_manager_argv,
        "kube-scheduler": configs.scheduler_argv,
    }[name](layout, bin_dir)
    pid = processes.start(argv, layout.log_for(name), layout.pid_for(name), processes.daemon_env())
    if name == "kube-apiserver":
        wait_for(
            "kube-apiserver /readyz",
            apiserver_ready(layout, admin_token(layout)),
            timeout_s,
            layout,
            str(layout.log_for(name)),
        )
    return pid
