"""What a dev-cluster command checks before it changes anything: root, the state
directory's lock (one command at a time) and, for `up`, the machine (packages, another
cluster or its cgroups, the fixed ports).

Called by `bringup` (all of it), `teardown`, `nodes` and `restarts` (root and the lock).
A refusal is a `UserError`: one line, exit code 2.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator

from rankpack.devcluster import host, packages, processes
from rankpack.devcluster.layout import PORTS, Layout, NodeSpec
from rankpack.errors import UserError

FOREIGN_DAEMONS = {"kubelet", "kube-apiserver", "etcd", "k3s", "k0s"}


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError(
            "rankpack dev-cluster must run as root (it starts a kubelet, mounts, creates "
            "cgroups and a network address)"
        )


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Hold the state directory's lock, or refuse if another command holds it."""
    layout.lock.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"another `rankpack dev-cluster` command holds {layout.lock}; wait for it"
            ) from None
        yield


def ports_taken(nodes: list[NodeSpec] | None = None) -> list[str]:
    """The fixed ports (the control plane's and the nodes') something already listens on."""
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


def check_machine(nodes: list[NodeSpec] | None = None) -> None:
    """Refuse (one line, exit 2) when the machine cannot host the cluster right now."""
    require_root()
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
    taken = ports_taken(nodes)
    if taken:
        raise UserError(f"ports in use: {', '.join(taken)}; stop what listens there")
