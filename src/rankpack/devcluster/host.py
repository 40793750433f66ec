"""What the dev cluster changes on the host outside its state directory, and undoing it.

`up` calls `record` before it changes anything (sysctls, which fixed paths and `kubepods`
cgroups already exist) and writes the result to ``<state>/host-before.json``; `down` reads
it back and calls the `remove_*`/`restore_*` functions below so that only what the cluster
created is removed. Everything here is a direct system call or an argv-list command.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rankpack.devcluster.layout import BRIDGE, HOST_PATHS, NODE_IP, SERVICE_FIRST_IP, SYSCTLS

CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
MNT_DETACH = 2


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str | None:
    try:
        return sysctl_path(name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    sysctl_path(name).write_text(value + "\n")


def kubepods_cgroups() -> list[Path]:
    """Every `kubepods` cgroup directly under a hierarchy (v1: one per controller; v2: one)."""
    found = []
    if (CGROUP_ROOT / KUBEPODS).is_dir():
        found.append(CGROUP_ROOT / KUBEPODS)
    if CGROUP_ROOT.is_dir():
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            if (hierarchy / KUBEPODS).is_dir():
                found.append(hierarchy / KUBEPODS)
    return found


def address_present(address: str) -> bool:
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", "lo"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout
    return f" {address}/32 " in out


def node_address_present() -> bool:
    return address_present(NODE_IP)


def service_address_present() -> bool:
    return address_present(SERVICE_FIRST_IP)


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def record() -> dict[str, Any]:
    """The host as `up` found it: what `down` must restore and must leave alone."""
    return {
        "sysctls": {name: read_sysctl(name) for name in SYSCTLS},
        "existing_paths": [p for p in HOST_PATHS if os.path.lexists(p)],
        "existing_kubepods": [str(p) for p in kubepods_cgroups()],
        "node_address_present": node_address_present(),
        "service_address_present": service_address_present(),
        "bridge_present": link_exists(BRIDGE),
    }


def add_address(address: str) -> None:
    if not address_present(address):
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True, timeout=10)


def remove_address(address: str) -> None:
    if address_present(address):
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=True, timeout=10)


def add_node_address() -> None:
    add_address(NODE_IP)


def remove_node_address() -> None:
    remove_address(NODE_IP)


def run_ip(args: list[str]) -> None:
    subprocess.run(["ip", *args], check=False, timeout=10, capture_output=True)


def remove_bridge() -> None:
    if link_exists(BRIDGE):
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, timeout=10)


def restore_sysctls(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is not None and read_sysctl(name) != value:
            write_sysctl(name, value)


def _unescape_mount_path(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_under(prefixes: Iterable[Path | str]) -> list[str]:
    """Mount points at or below any prefix, deepest first."""
    roots = [str(p).rstrip("/") for p in prefixes]
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape_mount_path(line.split()[4])
            if any(point == r or point.startswith(r + "/") for r in roots):
                found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def unmount_all(prefixes: Iterable[Path | str], timeout_s: float = 20) -> list[str]:
    """Detach every mount below `prefixes` (repeat: one path can be mounted several times).
    Returns what could not be unmounted."""
    prefixes = list(prefixes)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    deadline = time.monotonic() + timeout_s
    while True:
        left = mounts_under(prefixes)
        if not left or time.monotonic() > deadline:
            return left
        for point in left:
            if libc.umount2(point.encode(), MNT_DETACH) != 0:
                err = ctypes.get_errno()
                if err not in (errno.EINVAL, errno.ENOENT):
                    time.sleep(0.05)


def cgroup_tree(root: Path) -> list[Path]:
    """`root` and every cgroup below it, deepest first."""
    dirs = [Path(d) for d, _subdirs, _files in os.walk(root)]
    return sorted(dirs, key=lambda p: -len(p.parts))


def cgroup_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    for d in cgroup_tree(root):
        try:
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def remove_cgroup_tree(root: Path, timeout_s: float = 20) -> bool:
    """Kill what runs in the tree, then remove it bottom-up. True if it is gone."""
    deadline = time.monotonic() + timeout_s
    while root.exists() and time.monotonic() < deadline:
        for pid in cgroup_pids(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for d in cgroup_tree(root):
            with contextlib.suppress(OSError):
                d.rmdir()
        if root.exists():
            time.sleep(0.1)
    return not root.exists()


def safe_rmtree(path: Path | str) -> bool:
    """Remove a tree unless anything is still mounted below it (rmtree would cross into a
    mount and delete the files of whatever is mounted there). True if it is gone."""
    if mounts_under([path]):
        return False
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def remove_paths(paths: Iterable[str]) -> list[str]:
    """Remove files/trees (after unmounting); return the ones that remain."""
    return [p for p in paths if not safe_rmtree(p)]
