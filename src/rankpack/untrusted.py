"""Reading files that someone with fewer rights may have written (a rank's log, an exit file
in a run directory its pods can write): never through a link, only a regular file, never
more than asked for, never blocking on a FIFO.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path is a link, a directory, a FIFO or a device: not read."""


def read_bytes(path: Path, max_bytes: int, offset: int = 0) -> bytes:
    """At most ``max_bytes`` of ``path`` from ``offset``. `FileNotFoundError` if it is
    not there, `NotARegularFile` (an OSError) if it is not a regular file or is a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last part is a symbolic link
            raise NotARegularFile(f"{path} is a symbolic link: not read") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"{path} is not a regular file: not read")
        return os.pread(fd, max(0, max_bytes), offset)
    finally:
        os.close(fd)


def open_append(path: Path) -> int:
    """A file descriptor appending to ``path`` (created if missing), never through a link
    put in its place (`NotARegularFile`)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)  # fmt: skip
    except OSError as exc:
        if exc.errno == 40:
            raise NotARegularFile(f"{path} is a symbolic link: not written") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARegularFile(f"{path} is not a regular file: not written")
    os.set_blocking(fd, True)
    return fd


def read_text(path: Path, max_bytes: int) -> str:
    """`read_bytes` from the start, decoded (undecodable bytes replaced)."""
    return read_bytes(path, max_bytes).decode("utf-8", errors="replace")
