"""mpirun's command line: Open MPI's ``mpirun`` or MPICH's hydra, ranks started in the pods.

Pure: `mpirun_argv` turns `MpirunArgs` into the argv that starts a simulation's ranks in
its rank pods through the rsh agent (`rsh`), whether mpirun runs on this host
(`hostmpirun`) or in the launcher pod (`launcher`); `check_mpi` is what both (and
`podmode`, before writing the launcher's instructions) check first.

Open MPI's options depend on its major version (`MpirunArgs.openmpi_major`): Open MPI 3
and 4 start their daemons with ORTE (``orted``), Open MPI 5 with PRRTE (``prterun``,
``prted``: from `PRRTE_MAJOR` on), whose options differ; `openmpi_major` reads the version
from what ``mpirun --version`` says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rankpack.backend.kubernetes.api.config import MPI_TRANSPORTS
from rankpack.backend.protocol import BackendError

FLAVOURS = ("openmpi", "mpich")
"""The MPI libraries whose launcher the backend drives: Open MPI's ``mpirun`` and MPICH's
hydra (``mpiexec.hydra``)."""
TCP_ONLY_MPICH_ENV = (
    ("MPIR_CVAR_NOLOCAL", "1"),
    ("UCX_TLS", "self,tcp"),
)
"""MPICH without shared memory: no ch4 shared-memory path between ranks it takes for local
(``MPIR_CVAR_NOLOCAL``), and UCX (Debian's MPICH 4.0 is ch4:ucx) limited to loopback within a
process and TCP: with its defaults UCX picks ``sysv``/``posix``/``cma`` shared memory between
processes it finds on one machine, whatever ``MPIR_CVAR_NOLOCAL`` says."""

SHM_MPICH_ENV = (("UCX_TLS", "^cma"),)
"""MPICH with its own choice of transports but UCX's ``cma`` (``process_vm_readv`` between
ranks, which needs ptrace rights a restricted pod's ranks lack): shared memory within a
pod through ``/dev/shm``, TCP between pods."""


PRRTE_MAJOR = 5
"""The first Open MPI whose mpirun is PRRTE's: its rsh agent, tree spawn and OOB
interfaces are PRRTE parameters (``--prtemca plm_ssh_agent``), its shared-memory transport
is ``sm`` with single copy in the ``smsc`` framework (``vader`` and
``btl_vader_single_copy_mechanism`` are gone). Open MPI 5.0's mpirun still maps
``--mca plm_rsh_agent`` to PRRTE's name, but PRRTE 3.0 ignores an ``oob_tcp_if_include``
subnet (it warns it found no interface in it), so its argv says neither."""
_OPENMPI_VERSION = re.compile(r"(?:\((?:Open MPI|OpenRTE)\) |Open MPI v)(\d+)\.")


def openmpi_major(version: str) -> int | None:
    """The major version in what ``mpirun --version`` (``mpirun (Open MPI) 5.0.7``; Open MPI
    4 called by another name, ``mpirun.openmpi``: ``(OpenRTE) 4.1.4``) or ``ompi_info
    --version`` (``Open MPI v4.1.4``) says; None for anything else (MPICH's hydra, nothing).
    ``tools/launch`` reads it the same way (``OpenMPIMajor``)."""
    found = _OPENMPI_VERSION.search(version[:4096])
    return int(found.group(1)) if found else None


def check_mpi(flavour: str, transport: str = "auto") -> None:
    """BackendError for an MPI flavour or transport the backend does not launch."""
    if flavour not in FLAVOURS:
        raise BackendError(
            f"MPI '{flavour}' cannot be launched on Kubernetes; use one of {', '.join(FLAVOURS)}"
        )
    if transport not in MPI_TRANSPORTS:
        raise BackendError(f"MPI transport '{transport}' not understood; use tcp or auto")


@dataclass(frozen=True)
class MpirunArgs:
    mpirun: str
    n_ranks: int
    hostfile: Path
    agent: Path
    """The rsh agent: must exist at this path inside the pods too (orted segfaults else)."""
    case_dir: Path
    command: Sequence[str]
    env: Mapping[str, str]
    """Set in every rank (``-x NAME=VALUE``), not in mpirun's own environment."""
    subnet: str | None = None
    as_root: bool = False
    flavour: str = "openmpi"
    """``openmpi`` (`mpirun`) or ``mpich`` (hydra's ``mpiexec``)."""
    transport: str = "auto"
    """`config.MPI_TRANSPORTS`: ``tcp`` only, or the library's choice (``auto``). With rank
    groups (decision 0012: `objects.grouppods`, one pod per simulation per node, named once
    in the hostfile with a slot per rank) ``auto`` means shared memory between the ranks of
    one pod (Open MPI ``self,vader,tcp``; MPICH and UCX with their defaults) and TCP
    between pods: each pod has its own IPC namespace and ``/dev/shm``, so ranks of other
    pods, and of other simulations, are never on shared memory with them."""
    local_address: str | None = None
    """MPICH: the address of this host (or launcher pod) that hydra's proxies in the rank
    pods connect back to (``-localhost``): pod names do not resolve without cluster DNS, and
    hydra would give them this host's name. Open MPI finds mpirun's address itself."""
    openmpi_major: int = 4
    """Open MPI's major version: ORTE's options below `PRRTE_MAJOR`, PRRTE's from it."""


def mpirun_argv(args: MpirunArgs) -> list[str]:
    """mpirun's command line (Open MPI's mpirun or MPICH's hydra) on the controller's
    host or in the launcher pod, ranks started in the pods via the rsh agent."""
    check_mpi(args.flavour, args.transport)
    if any(c.isspace() for c in str(args.agent)):
        raise BackendError(f"the rsh agent path {args.agent} contains whitespace")
    if args.flavour == "mpich":
        return _hydra_argv(args)
    # Open MPI 3-4 (ORTE) or 5 (PRRTE's ``prterun``): the same argv in each one's names
    prrte = args.openmpi_major >= PRRTE_MAJOR
    shm = "sm" if prrte else "vader"
    btl = "self,tcp" if args.transport == "tcp" else f"self,{shm},tcp"
    plm = ("--prtemca", "plm_ssh_") if prrte else ("--mca", "plm_rsh_")
    argv = [
        args.mpirun, "-np", str(args.n_ranks), "--hostfile", str(args.hostfile),
        "--map-by", "slot", "--bind-to", "none", "--wdir", str(args.case_dir),
        plm[0], f"{plm[1]}agent", str(args.agent),
        plm[0], f"{plm[1]}no_tree_spawn", "1",
        "--mca", "pml", "ob1", "--mca", "btl", btl,
    ]  # fmt: skip
    if args.transport != "tcp":  # (process_vm_readv between ranks needs ptrace rights)
        argv += ["--mca", "smsc", "^cma"] if prrte else [
            "--mca", "btl_vader_single_copy_mechanism", "none"]  # fmt: skip
    if args.subnet:
        if not prrte:  # (PRRTE's daemons take every interface but loopback: a pod has one)
            argv += ["--mca", "oob_tcp_if_include", args.subnet]
        argv += ["--mca", "btl_tcp_if_include", args.subnet]
    if args.as_root:
        argv.append("--allow-run-as-root")
    for name in sorted(args.env):
        argv += ["-x", f"{name}={args.env[name]}"]
    return [*argv, *args.command]


def _hydra_argv(args: MpirunArgs) -> list[str]:
    """MPICH's hydra: one proxy per rank pod, each started by ``AGENT POD CMD...`` exactly as
    Open MPI's daemons are (so the same rsh agent serves); proxies connect back to
    ``local_address``; ranks get only the environment given here (``-genvnone``: nothing of
    this host's), the TCP-only switches first unless the transport is ``auto``."""
    argv = [
        args.mpirun, "-n", str(args.n_ranks), "-f", str(args.hostfile),
        "-launcher", "rsh", "-launcher-exec", str(args.agent),
        "-wdir", str(args.case_dir), "-genvnone",
    ]  # fmt: skip
    if args.local_address:
        argv += ["-localhost", args.local_address]
    env = dict(TCP_ONLY_MPICH_ENV) if args.transport == "tcp" else dict(SHM_MPICH_ENV)
    env.update(args.env)
    for name in sorted(env):
        argv += ["-genv", name, env[name]]
    return [*argv, *args.command]
