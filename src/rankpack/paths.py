"""Checks of the places rankpack reads and writes, done before any work starts.

Called by the CLI's argparse ``type=`` functions and its database/data-directory helpers
(`rankpack.cli.common`), and by `rankpack.case.openfoam` for case directories. Nothing here
creates anything: a check looks at the path, its nearest existing ancestor and the mount it
lives on, and raises `rankpack.quantities.InvalidQuantity` (one line, exit 2 in the CLI).

Root may write to a directory whatever its mode bits say, so "writable" here means: not on
a read-only mount, not on a kernel pseudo filesystem (/proc, /sys, cgroupfs, ...), and
``os.access(W_OK)`` for other users.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rankpack.quantities import InvalidQuantity, literal, path_text

PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc", "sysfs", "cgroup", "cgroup2", "devtmpfs", "devpts", "debugfs", "tracefs",
        "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "binfmt_misc",
        "autofs", "efivarfs", "hugetlbfs", "nsfs", "rpc_pipefs", "selinuxfs",
    }
)  # fmt: skip
MAX_CASE_ENTRIES = 1_000_000
"""A case with more files than this is refused rather than walked for minutes."""
MAX_CASE_DEPTH = 64
"""Deepest directory nesting walked in a case."""


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    read_only: bool


def _unescape(field: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and len(field[i + 1 : i + 4]) == 3:
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_of(path: str) -> Mount | None:
    """The mount holding ``path`` (absolute, resolved), from /proc/self/mounts."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    best: Mount | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        point = _unescape(parts[1])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.point)):
            best = Mount(point, parts[2], "ro" in parts[3].split(","))
    return best


def _absolute(text: str, name: str) -> Path:
    path_text(text, name)
    try:
        return Path(os.path.realpath(Path(text).expanduser()))
    except (OSError, RuntimeError, ValueError) as exc:
        raise InvalidQuantity(f"{{{name}}} {literal(text)} cannot be resolved ({exc})") from None


def _lstat_kind(path: Path) -> str | None:
    """'dir', 'file', 'other' or None (missing); symlinks followed, loops reported."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "loop"
        if exc.errno == errno.ENOTDIR:
            return "under-file"
        return "unreadable"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


def _check_writable_dir(directory: Path, name: str, shown: str) -> None:
    """``directory`` exists and is a directory: may we create entries in it?"""
    mount = mount_of(str(directory))
    if mount is not None and mount.fstype in PSEUDO_FILESYSTEMS:
        raise InvalidQuantity(
            f"{{{name}}} {shown} is on {mount.point} ({mount.fstype}), a kernel filesystem "
            "that holds no user files; choose a directory on a disk"
        )
    if mount is not None and mount.read_only:
        raise InvalidQuantity(
            f"{{{name}}} {shown}: {mount.point} is mounted read-only; choose a writable directory"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidQuantity(f"{{{name}}} {shown}: directory {directory} is not writable")


def _nearest_existing(path: Path, name: str, shown: str) -> Path:
    """The nearest existing ancestor of a missing ``path``; it must be a directory."""
    parent = path.parent
    while True:
        kind = _lstat_kind(parent)
        if kind == "dir":
            return parent
        if kind in ("file", "other", "under-file"):
            raise InvalidQuantity(f"{{{name}}} {shown}: {parent} is a file, not a directory")
        if kind == "loop":
            raise InvalidQuantity(f"{{{name}}} {shown}: {parent} is a symlink loop")
        if kind == "unreadable":
            raise InvalidQuantity(f"{{{name}}} {shown}: {parent} cannot be read")
        if parent == parent.parent:
            raise InvalidQuantity(f"{{{name}}} {shown}: no existing directory above it")
        parent = parent.parent


def output_dir(
    text: str | os.PathLike[str],
    name: str,
    *,
    must_be_empty: bool = False,
    parent_must_exist: bool = False,
) -> Path:
    """A directory rankpack will create or write into: usable, or one line why not."""
    raw = os.fspath(text)
    shown = literal(raw, 80)
    path = _absolute(raw, name)
    kind = _lstat_kind(path)
    if kind == "dir":
        _check_writable_dir(path, name, shown)
        if must_be_empty and any(path.iterdir()):
            raise InvalidQuantity(
                f"{{{name}}} {shown} exists and is not empty; give a new directory"
            )
        return path
    if kind in ("file", "other"):
        raise InvalidQuantity(f"{{{name}}} {shown} is a file, not a directory")
    if kind == "loop":
        raise InvalidQuantity(f"{{{name}}} {shown} is a symlink loop")
    if kind in ("under-file", "unreadable"):
        _nearest_existing(path, name, shown)  # names the file in the way
        raise InvalidQuantity(f"{{{name}}} {shown} cannot be used as a directory")
    if parent_must_exist and _lstat_kind(path.parent) != "dir":
        raise InvalidQuantity(f"{{{name}}} {shown}: parent directory {path.parent} does not exist")
    _check_writable_dir(_nearest_existing(path, name, shown), name, shown)
    return path


def new_dir(text: str | os.PathLike[str], name: str) -> Path:
    """A directory that must not exist yet and whose parent exists and is writable."""
    raw = os.fspath(text)
    shown = literal(raw, 80)
    path = _absolute(raw, name)
    if _lstat_kind(path) is not None or os.path.lexists(path):
        raise InvalidQuantity(f"{{{name}}} {shown} already exists; give a new directory")
    return output_dir(raw, name, parent_must_exist=True)


def output_file(
    text: str | os.PathLike[str],
    name: str,
    *,
    parent_must_exist: bool = True,
) -> Path:
    """A file rankpack will create or overwrite (a plot, the database): usable, or why not."""
    raw = os.fspath(text)
    shown = literal(raw, 80)
    if raw.endswith("/"):
        raise InvalidQuantity(f"{{{name}}} {shown} ends with '/'; give a file name")
    path = _absolute(raw, name)
    kind = _lstat_kind(path)
    if kind == "dir":
        raise InvalidQuantity(f"{{{name}}} {shown} is a directory; give a file path")
    if kind == "other":
        raise InvalidQuantity(f"{{{name}}} {shown} is not a regular file")
    if kind == "loop":
        raise InvalidQuantity(f"{{{name}}} {shown} is a symlink loop")
    if kind in ("under-file", "unreadable"):
        _nearest_existing(path, name, shown)
        raise InvalidQuantity(f"{{{name}}} {shown} cannot be used as a file path")
    if kind == "file":
        _check_writable_dir(path.parent, name, shown)
        if not os.access(path, os.W_OK):
            raise InvalidQuantity(f"{{{name}}} {shown} is not writable")
        return path
    if parent_must_exist and _lstat_kind(path.parent) != "dir":
        raise InvalidQuantity(f"{{{name}}} {shown}: directory {path.parent} does not exist")
    _check_writable_dir(_nearest_existing(path, name, shown), name, shown)
    return path


SQLITE_MAGIC = b"SQLite format 3\x00"


def database_file(text: str | os.PathLike[str], name: str) -> Path:
    """The SQLite database: `output_file` (its directory may be created), and an existing
    non-empty file must be an SQLite database; anything else is refused untouched (SQLite
    would otherwise turn a short text file into a database)."""
    path = output_file(text, name, parent_must_exist=False)
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise InvalidQuantity(
            f"{{{name}}} {literal(os.fspath(text), 80)} cannot be read ({exc.strerror})"
        ) from None
    if head and head != SQLITE_MAGIC:
        raise InvalidQuantity(
            f"{{{name}}} {literal(os.fspath(text), 80)} is not an SQLite database; "
            "give a new file or a rankpack database"
        )
    return path


PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def plot_file(text: str | os.PathLike[str], name: str) -> Path:
    """An image to write: `output_file` plus a format matplotlib writes (from the suffix)."""
    path = output_file(text, name)
    suffix = path.suffix.lower().lstrip(".")
    if suffix and suffix not in PLOT_FORMATS:
        raise InvalidQuantity(
            f"{{{name}}} {literal(os.fspath(text), 80)}: cannot draw a '.{suffix}' image; "
            f"use one of .{', .'.join(PLOT_FORMATS)}"
        )
    return path


def report_file(text: str | os.PathLike[str], name: str) -> Path:
    """An HTML report to write: `output_file` with an .html or .htm suffix; its figures go
    into a directory beside it, which must not be a file."""
    path = output_file(text, name)
    if path.suffix.lower() not in (".html", ".htm"):
        raise InvalidQuantity(
            f"{{{name}}} {literal(os.fspath(text), 80)} is not an .html file; give e.g. report.html"
        )
    figures = path.with_name(f"{path.stem}_figures")
    if os.path.lexists(figures) and not figures.is_dir():
        raise InvalidQuantity(
            f"{{{name}}} {literal(os.fspath(text), 80)}: {figures} (where its figures go) is a "
            "file; move it or choose another name"
        )
    return path


def check_tree(
    root: Path,
    *,
    skip_top: tuple[str, ...] = (),
    on_link: Callable[[Path, Path, Path], None] | None = None,
) -> None:
    """A directory to be copied or read whole (an OpenFOAM case): refuse FIFOs, sockets,
    devices, broken symlinks and symlink loops, which would hang or crash a copy.

    Symlinks are followed as `shutil.copytree(symlinks=False)` does; a directory reached
    twice on one path is a loop. Top-level names starting with ``skip_top`` are not walked
    (they are not copied either). ``on_link(root, link, target)`` is called for every
    symlink with its resolved target (a confined staging refuses links out of the case).
    """
    entries = 0
    shown = literal(str(root), 80)

    def walk(directory: Path, ancestors: frozenset[tuple[int, int]], top: bool) -> None:
        nonlocal entries
        if len(ancestors) > MAX_CASE_DEPTH:
            raise InvalidQuantity(
                f"case {shown} nests directories more than {MAX_CASE_DEPTH} deep at {directory}"
            )
        try:
            with os.scandir(directory) as it:
                items = list(it)
        except OSError as exc:
            raise InvalidQuantity(
                f"case {shown}: cannot read {directory} ({exc.strerror})"
            ) from None
        for entry in items:
            if top and entry.name.startswith(skip_top):
                continue
            entries += 1
            if entries > MAX_CASE_ENTRIES:
                raise InvalidQuantity(
                    f"case {shown} has more than {MAX_CASE_ENTRIES} files; is it a case directory?"
                )
            path = Path(entry.path)
            try:
                st = os.stat(path)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InvalidQuantity(f"case {shown}: {path} is a symlink loop") from None
                if entry.is_symlink():
                    raise InvalidQuantity(
                        f"case {shown}: {path} is a broken symlink; remove it or fix its target"
                    ) from None
                raise InvalidQuantity(
                    f"case {shown}: cannot read {path} ({exc.strerror})"
                ) from None
            if on_link is not None and entry.is_symlink():
                on_link(root, path, path.resolve())
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    raise InvalidQuantity(
                        f"case {shown}: {path} links back to a directory above it (a symlink loop)"
                    )
                walk(path, ancestors | {key}, False)
            elif not stat.S_ISREG(st.st_mode):
                kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a special file"
                raise InvalidQuantity(
                    f"case {shown}: {path} is {kind}; a case holds only files and directories"
                )

    try:
        st = os.stat(root)
    except OSError as exc:
        raise InvalidQuantity(f"case {shown} cannot be read ({exc.strerror})") from None
    walk(root, frozenset({(st.st_dev, st.st_ino)}), True)
