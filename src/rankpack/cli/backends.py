"""Which backend a command runs on: `--backend local|kubernetes` and the Kubernetes flags.

`--kubeconfig`, `--context` and `--namespace` default the way kubectl does (KUBECONFIG,
~/.kube/config, the context's namespace, in-cluster). For the dev cluster, use the backend's
least-privilege identity: `--kubeconfig "$(rankpack dev-cluster status --json | jq -r
.service_account_kubeconfig)"`.
"""

from __future__ import annotations

import argparse

from rankpack.backend.kubernetes.api.config import (
    LAUNCHER_CHOICES,
    MPI_TRANSPORTS,
    parse_transport,
    resolve_launcher,
)
from rankpack.backend.local import LocalBackend
from rankpack.backend.protocol import Backend, BackendError
from rankpack.cli.common import parse_cores
from rankpack.errors import UserError


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["local", "kubernetes"],
        default="local",
        help="local (default): each rank in a cgroup on this machine; kubernetes: each rank "
        "in its own pod, resized through pods/resize",
    )
    p.add_argument("--kubeconfig", help="kubernetes: kubeconfig file (default: as kubectl)")
    p.add_argument("--context", help="kubernetes: kubeconfig context (default: current)")
    p.add_argument("--namespace", help="kubernetes: namespace (default: the context's)")
    p.add_argument(
        "--image", help="kubernetes: rank pod image with the solver and MPI (default: the dev "
        "cluster's host-usr image)"
    )  # fmt: skip
    p.add_argument(
        "--launcher", choices=LAUNCHER_CHOICES, default="auto",
        help="kubernetes: where mpirun runs: pod (a launcher pod per simulation, beside its "
        "ranks; needs a rank image with rankpack), host (here, ranks entered through "
        "pods/exec), auto (default: pod unless the image is the dev cluster's host-usr)",
    )  # fmt: skip
    p.add_argument(
        "--allocatable",
        type=parse_cores,
        help="kubernetes: CPU (cores) rankpack may place on, when its identity may not read "
        "nodes (the least-privilege Role in deploy/ may not); e.g. 2 on the dev cluster",
    )
    p.add_argument(
        "--mpi-transport",
        choices=list(MPI_TRANSPORTS),
        default="auto",
        help="kubernetes: how ranks talk: auto (default: the MPI library's own choice, "
        "shared memory between the ranks of one pod, TCP between pods) or tcp (TCP over "
        "the pod network only, no shared-memory transport)",
    )
    p.add_argument(
        "--volume",
        help="kubernetes: where the case lives in the pods: pvc:CLAIM[:MOUNT_PATH] or "
        "host:DIR (default: the run directory as a host path, for the dev cluster)",
    )


def make_backend(args: argparse.Namespace, *, use_cgroups: bool = True) -> Backend:
    if getattr(args, "backend", "local") == "local":
        return LocalBackend(use_cgroups=use_cgroups)
    from dataclasses import replace

    from rankpack.backend.kubernetes.api.config import load_config
    from rankpack.backend.kubernetes.connect import connect
    from rankpack.devcluster.nodefiles import with_node_files
    from rankpack.plan.allocation import budget_to_millis

    try:
        config = load_config(args.kubeconfig, args.context, args.namespace, image=args.image)
    except UserError as exc:
        raise UserError(f"{exc}{_dev_cluster_hint(args.kubeconfig)}") from None
    config = replace(
        with_node_files(config),
        launcher=resolve_launcher(args.launcher, config.image),
        mpi_transport=parse_transport(getattr(args, "mpi_transport", "auto")),
    )
    if args.allocatable is not None:
        config = replace(config, allocatable_millis=budget_to_millis(args.allocatable))
    try:
        return connect(config)
    except BackendError as exc:
        raise UserError(str(exc)) from None


def _dev_cluster_hint(given: str | None) -> str:
    """Where the dev cluster's kubeconfig is, when none was found and one is up here."""
    from rankpack.devcluster.layout import Layout, default_state_dir

    kubeconfig = Layout(default_state_dir()).service_account_kubeconfig
    if given or not kubeconfig.is_file():
        return ""
    return f" (the dev cluster on this machine: --kubeconfig {kubeconfig})"
