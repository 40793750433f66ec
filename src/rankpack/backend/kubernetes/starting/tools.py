"""``rankpack-tools`` on a launcher-pod simulation's case volume (docs/own-image.md).

What must run inside the Simulation's own image runs from there, not from the image:
``rankpack-rankd`` (each rank pod's process), ``rankpack-exec`` (mpirun's rsh agent in the
launcher pod) and ``rankpack-launch`` (the launcher's last step, which starts mpirun). They
are one static binary built from ``tools/`` (Go, ``CGO_ENABLED=0``: no libc, no Python),
which ships in this package's ``_lib`` (`rankpack.devcluster.toolsbuild`); `install` puts it
and a link per name at `keyed.TOOLS_DIR` of the case, where the launcher pod and every rank
pod see it at the same path (Open MPI's orted needs the agent's path where it runs too).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from rankpack import untrusted
from rankpack.backend.kubernetes.objects import keyed
from rankpack.backend.protocol import LaunchFailed
from rankpack.case import foamexec

BINARY = foamexec.BINARY


@functools.cache
def _binary_bytes() -> bytes:
    return foamexec.binary_bytes()


def binary_bytes() -> bytes:
    """The tools' binary as this installation ships it; `LaunchFailed` if it was not built."""
    try:
        return _binary_bytes()
    except OSError as exc:
        raise LaunchFailed(
            f"this rankpack has no {BINARY} (a launcher-pod simulation needs it): build it "
            f"with `python -m rankpack.devcluster.toolsbuild` ({exc})"
        ) from exc


def _clear(path: Path) -> None:
    """Whatever stands at ``path`` removed (a link is removed, never followed)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def install(case_dir: Path) -> Path:
    """The tools at `keyed.TOOLS_DIR` of ``case_dir``: the binary and a link of each name
    (`keyed.TOOL_NAMES`) to it, replacing whatever a rank put there; their directory."""
    data = binary_bytes()
    d = untrusted.own_dir(untrusted.own_dir(case_dir / keyed.TOOLS_DIR.parent) /
                          keyed.TOOLS_DIR.name)  # fmt: skip
    untrusted.write_file(d / BINARY, data, 0o755)
    for name in keyed.TOOL_NAMES:
        _clear(d / name)
        os.symlink(BINARY, d / name)
    return d
