"""What enters a launcher-pod simulation's rank pods by its key (decision 0013; the server
and client are `starting.keyexec`): the key's place in the owner ConfigMap, the volume that
mounts it in that simulation's rank and launcher pods only, the rank container's command.
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
RANKD_COMMAND = ("rankpack-rankd",)
"""The rank container's process in a launcher-pod simulation (`keyexec.main`)."""
KEY_ENV = "RANKPACK_RANKD_KEY"
"""The launcher's environment: the key file (`rsh` enters the rank pods with it)."""


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
