"""Which Debian packages the dev cluster needs, and which of them this machine lacks.

`setup.sh` installs them; `up` (`rankpack.devcluster.lifecycle.preflight`) calls
`missing_packages` first and refuses with one line naming the ``apt-get install`` to run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rankpack.devcluster.configs import CNI_BIN_DIR

# Debian package -> a file it installs that the dev cluster uses.
REQUIRED: dict[str, tuple[str, ...]] = {
    "containerd": ("containerd", "containerd-shim-runc-v2", "ctr"),
    "runc": ("runc",),
    "containernetworking-plugins": (
        str(CNI_BIN_DIR / "bridge"),
        str(CNI_BIN_DIR / "host-local"),
        str(CNI_BIN_DIR / "loopback"),
    ),
    "etcd-server": ("etcd",),
    "busybox-static": ("busybox",),
    "umoci": ("umoci",),
    "gcc": ("gcc",),
    "iproute2": ("ip",),
    "mount": ("mount", "umount"),
    # each node's kubelet and containerd run in a mount namespace of the node's own
    "util-linux": ("unshare", "nsenter"),
}


def _present(tool: str) -> bool:
    if tool.startswith("/"):
        return Path(tool).is_file()
    return shutil.which(tool) is not None or Path("/usr/sbin", tool).is_file()


def missing_packages() -> list[str]:
    return [pkg for pkg, tools in REQUIRED.items() if not all(_present(t) for t in tools)]


def tool(name: str) -> str:
    """Absolute path of a required executable (root's PATH may lack /usr/sbin)."""
    found = shutil.which(name) or (
        str(Path("/usr/sbin", name)) if Path("/usr/sbin", name).is_file() else None
    )
    return found or name


def install_hint(missing: list[str]) -> str:
    return (
        "missing Debian packages: "
        + " ".join(missing)
        + " (install them with `bash setup.sh test` or `apt-get install "
        + " ".join(missing)
        + "`)"
    )
