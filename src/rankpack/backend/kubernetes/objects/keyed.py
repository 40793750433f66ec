"""What enters a launcher-pod simulation's rank pods by its key (decision 0013; the server
and client are ``rankpack-rankd`` and ``rankpack-exec`` of ``tools/keyexec``): the key's
place in the owner ConfigMap, the volume that mounts it in that simulation's rank and
launcher pods only, where the tools are on the case volume, the rank container's command.
Pure."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

PORT = 8476
"""Where ``rankpack-rankd`` listens in a rank pod."""
KEY_DIR = Path("/etc/rankpack/sim")
KEY_ITEM = "key"
"""The key's name in the owner ConfigMap and its file in `KEY_DIR`."""
KEY_VOLUME = "rankpack-key"
TOOLS_DIR = Path(".rankpack/bin")
"""Where, relative to the case directory, the operator puts ``rankpack-tools`` and its names
(`starting.tools.install`): a path that exists in the launcher pod and every rank pod,
whatever the Simulation's image (the tools are static: no libc, no Python)."""
RANKD = "rankpack-rankd"
AGENT = "rankpack-exec"
LAUNCH = "rankpack-launch"
TOOL_NAMES = (RANKD, AGENT, LAUNCH)


def tool(case_dir: Path, name: str) -> Path:
    """The tool ``name`` (`TOOL_NAMES`) of a simulation whose case is at ``case_dir``."""
    return case_dir / TOOLS_DIR / name


def rankd_command(case_dir: Path) -> tuple[str, ...]:
    """The rank container's process in a launcher-pod simulation (tools/keyexec)."""
    return (str(tool(case_dir, RANKD)),)


KEY_ENV = "RANKPACK_RANKD_KEY"
"""mpirun's environment in the launcher pod: the key file ``rankpack-exec`` enters the rank
pods with."""
HOSTS_ENV = "RANKPACK_RANKD_HOSTS"
"""mpirun's environment in the launcher pod: a JSON file naming each rank pod's IP (the
launcher's init container writes it from the pods it waited for)."""


def new_key() -> str:
    """A simulation's key (256 random bits, hex)."""
    return os.urandom(32).hex()


LAUNCH_ITEM = "launch.json"
"""The launcher's instructions in the owner ConfigMap and in `KEY_DIR` (launcher pod only)."""
HOSTFILE_ITEM = "hostfile"
"""mpirun's hostfile (a line per group pod) in the owner ConfigMap and in `KEY_DIR`."""
LAUNCHER_ITEMS = (KEY_ITEM, LAUNCH_ITEM, HOSTFILE_ITEM)


def launcher_volume(owner: str) -> tuple[Obj, Obj]:
    """The launcher pod's view of the owner ConfigMap ``owner``, read-only at `KEY_DIR`: the
    key, its instructions and the hostfile, which no rank can change (the run directory,
    which every rank pod mounts read-write, holds none of them): (volume, mount)."""
    return _owner_items(owner, LAUNCHER_ITEMS)


def key_volume(owner: str) -> tuple[Obj, Obj]:
    """The key alone of the owner ConfigMap ``owner``, read-only at `KEY_DIR`: (volume,
    mount)."""
    return _owner_items(owner, (KEY_ITEM,))


def _owner_items(owner: str, items: tuple[str, ...]) -> tuple[Obj, Obj]:
    """``items`` of the owner ConfigMap ``owner``, each a file of its name, read-only at
    `KEY_DIR`: (volume, mount)."""
    volume = {"name": KEY_VOLUME, "configMap": {
        "name": owner, "items": [{"key": i, "path": i} for i in items],
        "defaultMode": 0o444}}  # fmt: skip
    return volume, {"name": KEY_VOLUME, "mountPath": str(KEY_DIR), "readOnly": True}
