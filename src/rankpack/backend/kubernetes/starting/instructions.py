"""The launcher pod's instructions: `Instructions`, written by the backend, read in the pod.

The backend's pod mode (`podmode.options`) puts them in the simulation's owner ConfigMap,
which the launcher pod alone mounts (`keyed.launcher_volume`); the launcher pod's program
(`launcher`) reads them there and checks every field (`Instructions.parse`:
`InstructionsError` names what is wrong), as nothing in the file is trusted.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.api.config import MPI_TRANSPORTS
from rankpack.backend.kubernetes.objects import builders
from rankpack.backend.kubernetes.starting import mpirunargs
from rankpack.backend.protocol import BackendError
from rankpack.quantities import MAX_RANKS

VERSION = 1
MAX_TIMEOUT_S = 7 * 24 * 3600.0
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class InstructionsError(ValueError):
    """The instructions file is not what the backend writes: refused, nothing is run."""


@dataclass(frozen=True)
class Instructions:
    """What the backend tells a launcher pod (``launch.json``; `to_json` and `parse`)."""

    sim_id: str
    namespace: str
    """Where the rank pods are (the launcher's ServiceAccount's namespace)."""
    container: str
    """The rank pods' container the ranks start in."""
    pods: tuple[str, ...]
    """The rank (group) pods, in rank order (the hostfile's order)."""
    hostfile: Path
    case_dir: Path
    """mpirun's working directory (``--wdir`` of the ranks)."""
    command: tuple[str, ...]
    """The solver's argv (each rank's)."""
    env: Mapping[str, str]
    """The ranks' environment (``-x NAME=VALUE``), not mpirun's."""
    log_path: Path
    """mpirun's stdout and stderr are appended here (rank 0's solver log)."""
    exit_path: Path
    """mpirun's exit code is written here; its directory holds the launch marker."""
    start_timeout_s: float
    """How long to wait for the rank pods to run."""
    poll_s: float = 1.0
    """How often the rank pods are listed while waiting."""
    subnet: str | None = None
    """Open MPI's TCP interfaces (a CIDR); None: the /24 holding every pod's IP, if any."""
    mpi: str = "openmpi"
    """The MPI library (`mpirunargs.FLAVOURS`): Open MPI's mpirun or MPICH's hydra."""
    transport: str = "auto"
    """`config.MPI_TRANSPORTS`: TCP only, or the library's choice."""
    ranks: int = 0
    """How many ranks mpirun starts (0: one per pod)."""

    @property
    def n_ranks(self) -> int:
        return self.ranks or len(self.pods)

    def to_json(self) -> str:
        data = {
            "version": VERSION,
            "sim_id": self.sim_id,
            "namespace": self.namespace,
            "container": self.container,
            "pods": list(self.pods),
            "hostfile": str(self.hostfile),
            "case_dir": str(self.case_dir),
            "command": list(self.command),
            "env": dict(self.env),
            "log_path": str(self.log_path),
            "exit_path": str(self.exit_path),
            "start_timeout_s": self.start_timeout_s,
            "poll_s": self.poll_s,
            "subnet": self.subnet,
            "mpi": self.mpi,
            "transport": self.transport,
        }
        if self.ranks:
            data["ranks"] = self.ranks
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str) -> Instructions:
        """The instructions in ``text``; `InstructionsError` for anything else (unknown or
        missing keys, wrong types, relative paths, names that are not DNS labels)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InstructionsError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InstructionsError("not a JSON object")
        missing = sorted(_KEYS - _OPTIONAL - set(data))
        unknown = sorted(set(data) - _KEYS)
        if missing or unknown:
            raise InstructionsError(f"missing keys {missing}, unknown keys {unknown}")
        if data["version"] != VERSION:
            raise InstructionsError(f"version {data['version']!r}; this launcher reads {VERSION}")
        pods = _strings(data, "pods")
        if not pods or len(set(pods)) != len(pods):
            raise InstructionsError("pods: one or more distinct pod names")
        for name in (*pods, _string(data, "namespace"), _string(data, "container")):
            _check_label(name)
        sim_id = _string(data, "sim_id")
        try:
            builders.check_sim_id(sim_id, len(pods))
        except BackendError as exc:
            raise InstructionsError(str(exc)) from exc
        command = _strings(data, "command")
        if not command:
            raise InstructionsError("command: empty")
        ranks = data.get("ranks", len(pods))
        if (
            isinstance(ranks, bool)
            or not isinstance(ranks, int)
            or not (len(pods) <= ranks < MAX_RANKS)
        ):
            raise InstructionsError(f"ranks: not a number of ranks of {len(pods)} pods")
        return cls(
            sim_id=sim_id,
            namespace=_string(data, "namespace"),
            container=_string(data, "container"),
            pods=tuple(pods),
            hostfile=_path(data, "hostfile"),
            case_dir=_path(data, "case_dir"),
            command=tuple(command),
            env=_env(data),
            log_path=_path(data, "log_path"),
            exit_path=_path(data, "exit_path"),
            start_timeout_s=_seconds(data, "start_timeout_s"),
            poll_s=min(_seconds(data, "poll_s"), 60.0),
            subnet=_subnet(data),
            mpi=_choice(data, "mpi", mpirunargs.FLAVOURS),
            transport=_choice(data, "transport", MPI_TRANSPORTS),
            ranks=ranks,
        )


_KEYS = frozenset({
    "version", "sim_id", "namespace", "container", "pods", "hostfile", "case_dir", "command",
    "env", "log_path", "exit_path", "start_timeout_s", "poll_s", "subnet", "mpi", "transport",
    "ranks",
})  # fmt: skip
"""What `Instructions.to_json` writes and `Instructions.parse` expects: no more, no less."""
_OPTIONAL = frozenset({"mpi", "transport", "ranks"})
"""Keys a launcher reads as their defaults (Open MPI, TCP) when absent: instructions
written before MPICH was launched on Kubernetes."""


def _choice(data: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str:
    if key not in data:
        return allowed[0]
    value = _string(data, key)
    if value not in allowed:
        raise InstructionsError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _string(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value or "\0" in value:
        raise InstructionsError(f"{key}: not a non-empty string")
    return value


def _check_label(name: str) -> None:
    if not _DNS_LABEL.match(name) or len(name) > 63:
        raise InstructionsError(f"'{name}' is not a DNS label")


def _strings(data: Mapping[str, Any], key: str) -> list[str]:
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise InstructionsError(f"{key}: not a list of strings")
    return list(value)


def _path(data: Mapping[str, Any], key: str) -> Path:
    path = Path(_string(data, key))
    if not path.is_absolute() or ".." in path.parts:
        raise InstructionsError(f"{key}: {path} is not an absolute path without '..'")
    return path


def _env(data: Mapping[str, Any]) -> dict[str, str]:
    value = data["env"]
    if not isinstance(value, dict):
        raise InstructionsError("env: not an object")
    for name, text in value.items():
        if not _ENV_NAME.match(name) or not isinstance(text, str) or "\0" in text:
            raise InstructionsError(f"env: {name!r} is not NAME: string")
    return dict(value)


def _seconds(data: Mapping[str, Any], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InstructionsError(f"{key}: not a number")
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise InstructionsError(f"{key}: {value} is not in (0, {MAX_TIMEOUT_S:.0f}] s")
    return float(value)


def _subnet(data: Mapping[str, Any]) -> str | None:
    if data["subnet"] is None:
        return None
    text = _string(data, "subnet")
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError as exc:
        raise InstructionsError(f"subnet: {exc}") from exc
