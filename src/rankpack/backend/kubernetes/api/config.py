"""Where the Kubernetes backend connects, and the case volume's shape: settings, no I/O but reads.

`KubernetesConfig` is what the CLI builds from ``--kubeconfig``/``--context``/``--namespace``
(`load_config` resolves them the way kubectl does: the flag, else ``$KUBECONFIG``, else
``~/.kube/config``, else the in-cluster ServiceAccount). `VolumeSource` is the typed choice
of where the case lives in a rank pod (`parse_volume` reads ``SimSpec.volume``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rankpack.errors import UserError

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEV_IMAGE = "rankpack.local/host-usr:1"
"""The dev cluster's "host /usr" image (`rankpack dev-cluster`): mounts this host's /usr."""
DEV_IMAGE_PREFIX = "rankpack.local/"
"""Images built locally by the dev cluster: never pulled (``imagePullPolicy: Never``)."""
LauncherMode = Literal["host", "pod"]
"""Where a simulation's mpirun runs (`KubernetesConfig.launcher`)."""
LAUNCHER_CHOICES = ("auto", "host", "pod")


def resolve_launcher(choice: str, image: str) -> LauncherMode:
    """``--launcher``: ``auto`` is a launcher pod whenever the rank image can hold one (every
    image but the dev cluster's host-usr, whose pods have no rankpack), else mpirun here."""
    if choice not in LAUNCHER_CHOICES:
        raise UserError(f"launcher '{choice}' not understood; use auto, host or pod")
    if choice == "auto":
        return "host" if image == DEV_IMAGE else "pod"
    if choice == "pod" and image == DEV_IMAGE:
        raise UserError(
            f"--launcher pod needs a rank image with rankpack in it, not the dev cluster's "
            f"{DEV_IMAGE}; give --image (e.g. rankpack.local/rank:dev after "
            "`rankpack dev-cluster up --operator`) or --launcher host"
        )
    return "host" if choice == "host" else "pod"


MpiTransport = Literal["tcp", "auto"]
"""How a simulation's ranks talk (`KubernetesConfig.mpi_transport`)."""
MPI_TRANSPORTS = ("tcp", "auto")


def parse_transport(text: str) -> MpiTransport:
    """``--mpi-transport``: ``tcp`` or ``auto``; UserError for anything else."""
    if text == "tcp":
        return "tcp"
    if text == "auto":
        return "auto"
    raise UserError(f"MPI transport '{text}' not understood; use tcp or auto")


ReadingsMode = Literal["auto", "node", "agent"]
AGENT_PORT = 8475


@dataclass(frozen=True)
class NodeFiles:
    """Where a node keeps what `nodereader` reads: the kubelet's root and the pods' cgroups.
    The node agent takes them as flags; the backend uses them with ``readings="node"``."""

    kubelet_root: Path = Path("/var/lib/kubelet")
    """The kubelet's ``--root-dir`` (its ``pods/<uid>/volumes`` hold the rank pods' records)."""
    cgroup_root: Path = Path("/sys/fs/cgroup")
    """Where the node's cgroup hierarchy is mounted (in the agent's pod: its host mount)."""
    pods_cgroup: str = "kubepods"
    """The node's pods cgroup below the cgroup root (``kubepods``; ``<root>/kubepods`` for a
    kubelet with ``--cgroup-root``: several nodes on one machine)."""


@dataclass(frozen=True)
class StagingBounds:
    """What the admin lets one staging take (``rankpack operator --staging-*``).

    A staging pod works in two containers (`objects.stagepods`: staging's Python and the
    OpenFOAM sidecar): each has these limits, and their requests add up to these."""

    deadline_s: int = 600
    """The pod's ``activeDeadlineSeconds``: a staging still running then is ended."""
    cpu_request_millis: int = 200
    cpu_limit_millis: int = 1000
    memory_mib: int = 2048
    """Memory: each container's limit, the pod's request."""
    ephemeral_mib: int = 1024
    """Ephemeral storage (each container's ``/tmp`` and logs; the run directory is on the
    volume): each container's limit, the pod's request."""
    tmp_size: str = "512Mi"

    @property
    def memory(self) -> str:
        """The memory limit, as a quantity."""
        return f"{self.memory_mib}Mi"


@dataclass(frozen=True)
class PodBounds:
    """Memory and ephemeral storage of the pods that run a user's code (a rank runs the
    case's ``libs``; a launcher the user's mpirun): requests and limits, per rank (a group
    pod: times its ranks) and per launcher pod, MiB. Never a CPU limit: CPU is the
    controller's to share (decision 0002)."""

    rank_memory_mib: tuple[int, int] = (256, 4096)
    rank_ephemeral_mib: tuple[int, int] = (64, 4096)
    launcher_memory_mib: tuple[int, int] = (128, 1024)
    launcher_ephemeral_mib: tuple[int, int] = (64, 1024)


def bounded(
    resources: dict[str, Any],
    memory_mib: tuple[int, int],
    ephemeral_mib: tuple[int, int],
    n: int = 1,
) -> dict[str, Any]:
    """``resources`` (a container's) with ``n`` times the memory and ephemeral storage."""
    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})
    for key, (req, lim) in (("memory", memory_mib), ("ephemeral-storage", ephemeral_mib)):
        requests[key], limits[key] = f"{req * n}Mi", f"{lim * n}Mi"
    return {**resources, "requests": requests, "limits": limits}


@dataclass(frozen=True)
class KubernetesConfig:
    """How to reach the cluster and what to run there."""

    kubeconfig: Path | None = None
    """A kubeconfig file; None: in-cluster configuration (a pod's ServiceAccount)."""
    context: str | None = None
    """The kubeconfig context; None: its current context."""
    namespace: str = "default"
    """Where every object of a simulation is created."""
    image: str = DEV_IMAGE
    """The rank pods' image when the simulation names none (it must hold the solver, Open
    MPI's orted, /bin/sh and sleep)."""
    pod_subnet: str | None = None
    """The pod network (CIDR) Open MPI's TCP traffic uses (``oob/btl_tcp_if_include``);
    None: let Open MPI pick interfaces."""
    allocatable_millis: int | None = None
    """Capacity to assume when the identity may not read nodes (no ClusterRole)."""
    poll_s: float = 1.0
    """The follower's timer (`poller`): between watch events, how often it looks at its
    timeouts, the creates to retry, the orphans to delete and an adopted mpirun's exit file.
    It reads the backend's cache: no request is sent to look (issue 29)."""
    start_timeout_s: float = 300.0
    """A simulation whose rank pods do not all run within this fails (``NotRunning``)."""
    unschedulable_s: float = 20.0
    """A rank or launcher pod the scheduler has reported unschedulable this long rolls its
    launch back (``Unschedulable``: its pods deleted, the simulation back in its queue):
    long enough for a pod being deleted to free its room, short of a minute in all."""
    release_timeout_s: float = 60.0
    """How long `release` waits for the garbage collector to remove the rank pods."""
    detach: bool = False
    """Start mpirun through a detached exit wrapper that outlives this process (the operator:
    a restarted operator adopts the simulation); False: mpirun is SIGTERMed if rankpack
    dies (`rankpack run`: nothing is left running)."""
    launcher: LauncherMode = "host"
    """Where each simulation's mpirun runs. ``host``: on this host, as this process's child
    (or detached, see `detach`); the ranks are entered through ``pods/exec`` with this
    process's identity (`rankpack run`, the dev cluster's host-``/usr`` image, whose pods
    hold no Python). ``pod``: in a launcher pod per simulation (``rankpack-<sim>-launcher``,
    the simulation's image, ServiceAccount ``rankpack-launcher``), so this process needs no
    ``pods/exec`` and may be killed, moved or upgraded while simulations run (the operator).
    See ``docs/decisions/0008-kubernetes-launcher.md``."""
    launcher_env: tuple[tuple[str, str], ...] = ()
    """Extra environment of the launcher pods (pod mode), e.g. ``KUBERNETES_SERVICE_HOST``
    and ``KUBERNETES_SERVICE_PORT`` on a cluster whose apiserver Service IP does not route
    from pods (no kube-proxy)."""
    launcher_cpu_millis: int = 50
    """The launcher pods' CPU request (pod mode; no limit): mpirun forwards rank 0's output
    and the rsh agents start the ranks, then mostly wait."""
    mpi_transport: MpiTransport = "auto"
    """How the ranks of a simulation talk. ``auto`` (the default): the MPI library's own
    choice: shared memory between the ranks of one group pod (its own ``/dev/shm`` and IPC
    namespace: never another simulation's, decision 0012), TCP between pods (Open MPI
    ``self,vader,tcp`` with vader's single copy off, which needs ptrace rights a restricted
    pod lacks; MPICH and UCX defaults but UCX's ``cma``). ``tcp``: TCP over the pod network
    only, every shared-memory transport off (Open MPI ``--mca btl self,tcp``; MPICH
    ``MPIR_CVAR_NOLOCAL=1`` and ``UCX_TLS=self,tcp``), a rank's traffic the same whether
    its peer is in its pod or not (for measurements; docs/kubernetes-backend.md)."""
    pod_bounds: PodBounds = field(default_factory=PodBounds)
    """Memory and ephemeral storage of every rank, group and launcher pod."""
    staging: StagingBounds = field(default_factory=StagingBounds)
    """What one staging pod may take (a confined case is staged in one: `podstaging`; but
    with the dev cluster's host-``/usr`` image, which holds no rankpack, in this process)."""
    readings: ReadingsMode = "auto"
    """Where the ranks' counters and shim records come from (decision 0010): ``node``, this
    process runs on the rank pods' node and reads its files (the single-node dev cluster);
    ``agent``, from the node agents (``rankpack node-agent``, the in-cluster operator);
    ``auto``, ``node`` when the kubelet's pods directory and the pods cgroup are here."""
    node_files: NodeFiles = field(default_factory=NodeFiles)
    """The node's files, for ``readings="node"``."""
    node_files_by_node: tuple[tuple[str, NodeFiles], ...] = ()
    """Several nodes' files on this one machine, by node name (the dev cluster's nodes, each
    with its own kubelet root and pods cgroup): ``node`` readings of a rank pod use its
    node's entry; empty, `node_files` for every pod."""
    agent_namespace: str | None = "rankpack-system"
    """Where the node agents' pods run (``deploy/``: ``rankpack-system``, apart from the
    restricted namespace Simulations run in; None: ``namespace``)."""
    agent_port: int = AGENT_PORT
    counted_namespaces: tuple[str, ...] = ()
    """Other namespaces whose live pods count in the inventory when this identity may not
    list pods cluster-wide: the other namespaces one operator serves (their rank pods share
    the nodes; `tenants`)."""

    def __post_init__(self) -> None:
        if self.launcher not in ("host", "pod"):
            raise UserError(f"launcher '{self.launcher}' not understood; use host or pod")
        if self.mpi_transport not in MPI_TRANSPORTS:
            raise UserError(f"MPI transport '{self.mpi_transport}' not understood; use tcp or auto")


def default_kubeconfig() -> Path | None:
    """kubectl's order: ``$KUBECONFIG`` (first entry), ``~/.kube/config``, in-cluster."""
    env = os.environ.get("KUBECONFIG")
    if env:
        first = next((p for p in env.split(os.pathsep) if p), None)
        if first:
            return Path(first).expanduser()
    home = Path("~/.kube/config").expanduser()
    if home.is_file():
        return home
    return None


def load_config(
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    namespace: str | None = None,
    *,
    image: str | None = None,
    pod_subnet: str | None = None,
) -> KubernetesConfig:
    """Settings from the CLI flags, filled in the way kubectl does.

    The namespace is the flag, else the context's namespace, else (in a pod) the pod's
    namespace, else ``default``.
    """
    path = Path(kubeconfig).expanduser() if kubeconfig else default_kubeconfig()
    if path is None:
        if not (IN_CLUSTER_DIR / "token").is_file():
            raise UserError(
                "no kubeconfig: give --kubeconfig, set KUBECONFIG, create ~/.kube/config, "
                "or run inside a pod with a ServiceAccount"
            )
        ns = namespace or _read(IN_CLUSTER_DIR / "namespace") or "default"
    else:
        if not path.is_file():
            raise UserError(f"kubeconfig {path} does not exist; give --kubeconfig or KUBECONFIG")
        ns = namespace or context_namespace(path, context) or "default"
    return KubernetesConfig(
        kubeconfig=path,
        context=context,
        namespace=ns,
        image=image or DEV_IMAGE,
        pod_subnet=pod_subnet,
    )


def context_namespace(path: Path, context: str | None) -> str | None:
    """The namespace a kubeconfig context names (None if it names none)."""
    import yaml  # type: ignore[import-untyped]  # (PyYAML, a dependency of kubernetes)
    from kubernetes import config as kconfig
    from kubernetes.config import ConfigException

    try:
        contexts, active = kconfig.list_kube_config_contexts(config_file=str(path))  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read kubeconfig {path}: {exc}") from exc
    chosen = active
    if context is not None:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(str(c.get("name")) for c in contexts)
            raise UserError(f"no context '{context}' in {path}; it has: {names}")
    if not chosen:
        return None
    ns = chosen.get("context", {}).get("namespace")
    return str(ns) if ns else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


# -- the case volume ------------------------------------------------------------------------


@dataclass(frozen=True)
class HostPathVolume:
    """A directory of the node (the dev cluster: the controller runs on the node itself).

    Mounted at the same path in every rank pod, so ``case_dir`` means the same everywhere.
    """

    path: Path


@dataclass(frozen=True)
class PvcVolume:
    """A PersistentVolumeClaim (ReadWriteMany) holding the runs root on a real cluster.

    It is mounted at ``mount_path`` in every rank pod; the controller must see the same
    volume at the same path (e.g. it runs in a pod that mounts it, or on an NFS client).
    """

    claim: str
    mount_path: Path


VolumeSource = HostPathVolume | PvcVolume


def parse_volume(text: str | None, case_dir: Path) -> VolumeSource:
    """``SimSpec.volume``: None → the case directory as a host path; ``host:DIR`` → a host
    directory holding the case; ``pvc:CLAIM[:MOUNT]`` → a claim mounted at MOUNT (default:
    the case directory's parent, the runs root). The case must lie inside the mount."""
    if not text:
        return HostPathVolume(case_dir)
    kind, _, rest = text.partition(":")
    if kind == "host" and rest:
        volume: VolumeSource = HostPathVolume(Path(rest))
        mount = Path(rest)
    elif kind == "pvc" and rest:
        claim, _, mount_text = rest.partition(":")
        mount = Path(mount_text) if mount_text else case_dir.parent
        volume = PvcVolume(claim, mount)
    else:
        raise UserError(f"volume '{text}' not understood; use host:DIR or pvc:CLAIM[:MOUNT_PATH]")
    if not mount.is_absolute():
        raise UserError(f"the volume's mount path {mount} must be absolute")
    if not case_dir.is_relative_to(mount):
        raise UserError(f"the case {case_dir} is not inside the volume mounted at {mount}")
    return volume


def mount_path(volume: VolumeSource) -> Path:
    return volume.path if isinstance(volume, HostPathVolume) else volume.mount_path
