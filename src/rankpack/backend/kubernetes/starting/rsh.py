"""The rsh agent a host-mode mpirun uses to start its daemons inside the rank pods (a
launcher pod's mpirun uses ``rankpack-exec`` of ``tools/``, by the simulation's key:
`tools`).

``mpirun --mca plm_rsh_agent <agent>`` runs ``<agent> <host> <orted command…>`` once per
host (``plm_rsh_no_tree_spawn``: all from mpirun). The agent runs the command inside the
pod named ``<host>`` through the API (``pods/exec``, like ``kubectl exec POD -- /bin/sh -c
"$*"``), streams its output and exits with its exit code. The command is Open MPI's own
orted command line, written for a remote shell: it is handed to ``/bin/sh -c`` unchanged.

The connection comes from the environment mpirun inherits from the backend:
``RANKPACK_KUBECONFIG`` (empty: in-cluster), ``RANKPACK_KUBE_CONTEXT``,
``RANKPACK_NAMESPACE``, ``RANKPACK_CONTAINER``. Run as ``python -m
rankpack.backend.kubernetes.starting.rsh`` or the ``rankpack-exec`` console script; the backend
writes a two-line wrapper script onto the case volume, a path that exists in the pods too
(Open MPI's orted segfaults when the agent's path does not exist where it runs).
"""

from __future__ import annotations

import faulthandler
import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_KUBECONFIG = "RANKPACK_KUBECONFIG"
ENV_CONTEXT = "RANKPACK_KUBE_CONTEXT"
ENV_NAMESPACE = "RANKPACK_NAMESPACE"
ENV_CONTAINER = "RANKPACK_CONTAINER"

CONNECT_RETRY_S = 180.0
"""How long an exec that could not start (the apiserver restarting, overloaded) is tried
again: a launch that meets an apiserver restart waits for it instead of failing the run
(mpirun waits for its daemons meanwhile)."""


def split_args(argv: Sequence[str]) -> tuple[str, str]:
    """``[opts…] host cmd…`` → (host, the command for ``sh -c``)."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        rest.pop(0)  # ssh-style options (none by default): meaningless for an exec
    if len(rest) < 2:
        raise SystemExit("usage: rankpack-exec POD COMMAND...")
    return rest[0], " ".join(rest[1:])


def agent_env(
    kubeconfig: Path | None, context: str | None, namespace: str, container: str
) -> dict[str, str]:
    return {
        ENV_KUBECONFIG: str(kubeconfig) if kubeconfig else "",
        ENV_CONTEXT: context or "",
        ENV_NAMESPACE: namespace,
        ENV_CONTAINER: container,
    }


def agent_script(python: str) -> str:
    """The wrapper the backend installs on the case volume as the agent."""
    return (
        f'#!/bin/sh\nexec {shlex.quote(python)} -m rankpack.backend.kubernetes.starting.rsh "$@"\n'
    )


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:

    # kill -USR1: where it waits, on its stderr (mpirun's log): an agent that does not exit
    # keeps mpirun from ending
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    env = os.environ if environ is None else environ
    host, command = split_args(sys.argv[1:] if argv is None else argv)
    # (the API client only here: its import is most of the agent's start-up)
    from rankpack.backend.kubernetes.api.client import ClientKubeApi
    from rankpack.backend.kubernetes.api.config import KubernetesConfig
    from rankpack.backend.protocol import BackendError

    kubeconfig = env.get(ENV_KUBECONFIG) or None
    config = KubernetesConfig(
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        context=env.get(ENV_CONTEXT) or None,
        namespace=env.get(ENV_NAMESPACE) or "default",
    )
    parent = os.getppid()
    try:
        api = ClientKubeApi(config)
        return api.exec_attached(
            host, env.get(ENV_CONTAINER) or "rank", ["/bin/sh", "-c", command], CONNECT_RETRY_S,
            abandoned=lambda: os.getppid() != parent,  # mpirun died: it waits for nothing
        )  # fmt: skip
    except BackendError as exc:
        print(f"rankpack-exec: {host}: {exc}", file=sys.stderr)
        return 255


if __name__ == "__main__":
    sys.exit(main())
