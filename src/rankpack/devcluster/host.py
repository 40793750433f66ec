"""What the dev cluster changes on the host outside its state directory, and undoing it.

`up` calls `record` before it changes anything (sysctls, which fixed paths, cgroups,
addresses on ``lo``, network devices and unreachable routes already exist) and writes the
result to ``<state>/host-before.json``; `down` reads it back and calls the
`remove_*`/`restore_*` functions below so that only what the cluster created is removed.
Also here: each node's cgroup root (`make_node_cgroup`), the daemons' cgroup
(`make_system_cgroup`) and each node's mount namespace (`create_node_namespace`).
Everything here is a direct system call or an argv-list command.
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

from rankpack.devcluster.layout import (
    BRIDGE,
    HOST_PATHS,
    NODE_IP,
    NODE_NAME,
    SERVICE_FIRST_IP,
    SYSCTLS,
    SYSTEM_CGROUP,
    SYSTEM_CPU_SHARES,
    UNREACHABLE_ROUTES,
    NodeSpec,
    format_cpus,
    parse_cpus,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
MNT_DETACH = 2
CPU_HIERARCHIES = ("cpu", "cpuacct", "cpu,cpuacct")
"""The v1 hierarchies the cluster's own daemons join `SYSTEM_CGROUP` in (the others, memory
above all, stay as they were)."""


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


def hierarchies() -> list[Path]:
    """The root of every cgroup hierarchy: ``/sys/fs/cgroup`` on a v2 host, else each v1
    mount below it (and the v2 one of a hybrid host)."""
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        return [CGROUP_ROOT]
    if not CGROUP_ROOT.is_dir():
        return []
    return [h for h in sorted(CGROUP_ROOT.iterdir()) if (h / "cgroup.procs").is_file()]


def is_node_cgroup_name(name: str) -> bool:
    """A node's cgroup root (`NodeSpec.cgroup_root`) or the daemons' cgroup."""
    return name in (NODE_NAME, SYSTEM_CGROUP) or (
        name.startswith(NODE_NAME + "-") and name[len(NODE_NAME) + 1 :].isdigit()
    )


def cluster_cgroups() -> list[Path]:
    """Every cgroup of a dev cluster directly below a hierarchy's root: each node's root
    and the daemons' cgroup (whichever cluster made them)."""
    found = []
    for h in hierarchies():
        for d in sorted(h.iterdir()):
            if d.is_dir() and is_node_cgroup_name(d.name):
                found.append(d)
    return found


def host_cpus() -> list[int]:
    """The host's online CPUs (what a kubelet's cAdvisor counts as the node's capacity)."""
    try:
        return parse_cpus(Path("/sys/devices/system/cpu/online").read_text())
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


def _write_cgroup(path: Path, value: str) -> None:
    path.write_text(value + "\n")


def make_node_cgroup(spec: NodeSpec) -> None:
    """The node's cgroup root in every hierarchy (the kubelet refuses a ``cgroupRoot`` that
    is missing from one), its ``cpuset.cpus`` the node's CPUs before its kubelet starts
    (the kubelet's and runc's cgroups below copy it), ``cpu.shares`` 1024 per CPU."""
    for h in hierarchies():
        d = h / spec.cgroup_root
        d.mkdir(exist_ok=True)
        if (d / "cpuset.cpus").exists():
            if not (d / "cpuset.mems").read_text().strip():
                _write_cgroup(d / "cpuset.mems", (h / "cpuset.mems").read_text().strip())
            _write_cgroup(d / "cpuset.cpus", format_cpus(spec.cpus))
        if (d / "cpu.shares").exists():
            _write_cgroup(d / "cpu.shares", str(1024 * len(spec.cpus)))


def make_system_cgroup() -> list[Path]:
    """`SYSTEM_CGROUP` in the cpu and cpuacct hierarchies, ``cpu.shares`` =
    `SYSTEM_CPU_SHARES`; returns the ``cgroup.procs`` files a daemon joins."""
    procs = []
    for h in hierarchies():
        if h.name not in CPU_HIERARCHIES and h != CGROUP_ROOT:
            continue
        d = h / SYSTEM_CGROUP
        d.mkdir(exist_ok=True)
        if (d / "cpu.shares").exists():
            _write_cgroup(d / "cpu.shares", str(SYSTEM_CPU_SHARES))
        elif (d / "cpu.weight").exists():  # v2: the same ratio to the default weight 100
            _write_cgroup(d / "cpu.weight", str(SYSTEM_CPU_SHARES * 100 // 1024))
        procs.append(d / "cgroup.procs")
    return procs


def lo_addresses() -> list[str]:
    """The IPv4 /32 addresses on ``lo`` (besides 127.0.0.1/8)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", "lo"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        if "inet" in words:
            addr = words[words.index("inet") + 1]
            if addr.endswith("/32"):
                found.append(addr[:-3])
    return found


def address_present(address: str) -> bool:
    return address in lo_addresses()


def node_address_present() -> bool:
    return address_present(NODE_IP)


def service_address_present() -> bool:
    return address_present(SERVICE_FIRST_IP)


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def links() -> list[str]:
    net = Path("/sys/class/net")
    return sorted(d.name for d in net.iterdir()) if net.is_dir() else []


def unreachable_routes() -> list[str]:
    """Destinations of the main table's ``unreachable`` routes."""
    out = subprocess.run(
        ["ip", "-4", "route", "show", "type", "unreachable"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout
    return [line.split()[1] for line in out.splitlines() if line.startswith("unreachable ")]


def add_unreachable_route(network: str) -> None:
    if network not in unreachable_routes():
        subprocess.run(["ip", "route", "add", "unreachable", network], check=True, timeout=10)


def remove_unreachable_route(network: str) -> None:
    if network in unreachable_routes():
        subprocess.run(["ip", "route", "del", "unreachable", network], check=False, timeout=10)


def record() -> dict[str, Any]:
    """The host as `up` found it: what `down` must restore and must leave alone."""
    return {
        "sysctls": {name: read_sysctl(name) for name in SYSCTLS},
        "existing_paths": [p for p in HOST_PATHS if os.path.lexists(p)],
        "existing_kubepods": [str(p) for p in kubepods_cgroups()],
        "existing_cgroups": [str(p) for p in cluster_cgroups()],
        "existing_addresses": lo_addresses(),
        "existing_links": links(),
        "existing_routes": [r for r in unreachable_routes() if r in UNREACHABLE_ROUTES],
        # what a record of a one-node cluster said (read by an older `down`)
        "node_address_present": node_address_present(),
        "service_address_present": service_address_present(),
        "bridge_present": link_exists(BRIDGE),
    }


def existing_addresses(record: dict[str, Any]) -> set[str]:
    """The ``lo`` addresses `up` found (also from a one-node cluster's older record)."""
    if "existing_addresses" in record:
        return set(record["existing_addresses"])
    found = {NODE_IP} if record.get("node_address_present", True) else set()
    return found | ({SERVICE_FIRST_IP} if record.get("service_address_present", True) else set())


def existing_links(record: dict[str, Any]) -> set[str]:
    if "existing_links" in record:
        return set(record["existing_links"])
    return {BRIDGE} if record.get("bridge_present", False) else set()


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


def bridge_ports(bridge: str) -> list[str]:
    """The devices enslaved to `bridge` (the host ends of its pods' veths)."""
    ports = []
    for name in links():
        master = Path("/sys/class/net", name, "master")
        if master.is_symlink() and os.path.basename(os.readlink(master)) == bridge:
            ports.append(name)
    return ports


def remove_link(name: str) -> None:
    if link_exists(name):
        subprocess.run(["ip", "link", "del", name], check=False, timeout=10, capture_output=True)


def remove_bridge(bridge: str = BRIDGE) -> None:
    """The bridge and the host ends of its veths: that node's pod network is gone."""
    for port in bridge_ports(bridge):
        remove_link(port)
    remove_link(bridge)


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


# -- each node's mount namespace ----------------------------------------------------------


def _mount(args: list[str]) -> None:
    subprocess.run(["mount", *args], check=True, timeout=10, capture_output=True)


def is_mount_point(path: Path | str) -> bool:
    return str(path).rstrip("/") in mounts_under([path])


def prepare_namespace_dir(directory: Path) -> None:
    """`directory` a private mount of itself: a namespace file may only be bound on a mount
    whose propagation is not shared, and nothing bound there propagates anywhere."""
    directory.mkdir(parents=True, exist_ok=True)
    if not is_mount_point(directory):
        _mount(["--bind", str(directory), str(directory)])
    _mount(["--make-private", str(directory)])


def create_node_namespace(
    ns_file: Path, binds: list[tuple[Path, str]], unshare: str = "unshare", nsenter: str = "nsenter"
) -> None:
    """A new mount namespace (private propagation: nothing mounted in it reaches the host,
    nor the host's later mounts it) kept by a bind mount at `ns_file`, with each
    (directory or file, fixed path) of `binds` mounted there (a missing source is made a
    directory; a directory's mount is made shared within the namespace). The fixed paths
    must exist."""
    ns_file.touch()
    subprocess.run(
        [unshare, f"--mount={ns_file}", "--propagation", "private", "true"],
        check=True, timeout=10, capture_output=True,
    )  # fmt: skip
    for source, target in binds:
        if not source.is_file():
            source.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [nsenter, f"--mount={ns_file}", "--", "mount", "--bind", str(source), target],
            check=True, timeout=10, capture_output=True,
        )  # fmt: skip
        if source.is_dir():
            # shared inside the node's namespace only (a peer group of its own: nothing
            # reaches the host), as a kubelet's directories are on a real host: a pod's
            # host path with HostToContainer propagation (the node agent's
            # /var/lib/kubelet/pods) needs a shared or slave mount below it
            subprocess.run(
                [nsenter, f"--mount={ns_file}", "--", "mount", "--make-shared", target],
                check=True, timeout=10, capture_output=True,
            )  # fmt: skip


def namespace_id(path: Path | str) -> tuple[int, int] | None:
    """(device, inode) of a namespace file (``/proc/PID/ns/mnt`` or a bound one)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pids_in_namespace(ns_file: Path) -> list[int]:
    """Every process whose mount namespace is the one bound at `ns_file` (none if it is not
    bound)."""
    if not is_mount_point(ns_file):
        return []
    ns = namespace_id(ns_file)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and namespace_id(entry / "ns" / "mnt") == ns:
            found.append(int(entry.name))
    return found


def drop_node_namespace(ns_file: Path) -> None:
    """Unbind the namespace file: with no process left in it, the namespace and everything
    mounted in it (pod volumes, network namespaces, container root filesystems) go."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    while is_mount_point(ns_file):
        if libc.umount2(str(ns_file).encode(), MNT_DETACH) != 0:
            break
    with contextlib.suppress(OSError):
        ns_file.unlink()


def kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
