"""Reading files that someone with fewer rights may have written (a rank's log, an exit file
in a run directory its pods can write): never through a link, only a regular file, never
more than asked for, never blocking on a FIFO.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path is a link, a directory, a FIFO or a device: not read."""


def _open_regular(
    path: Path, flags: int, what: str, mode: int = 0o644, dir_fd: int | None = None
) -> int:
    """``path`` opened with ``flags`` (never through a link, never blocking on a FIFO);
    `NotARegularFile` if the last part is a link or not a regular file. A relative ``path``
    is taken in the directory ``dir_fd`` (`open_dir`) when given."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)  # fmt: skip
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last part is a symbolic link
            raise NotARegularFile(f"{path} is a symbolic link: not {what}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARegularFile(f"{path} is not a regular file: not {what}")
    return fd


def read_bytes(path: Path, max_bytes: int, offset: int = 0, *, dir_fd: int | None = None) -> bytes:
    """At most ``max_bytes`` of ``path`` from ``offset``. `FileNotFoundError` if it is
    not there, `NotARegularFile` (an OSError) if it is not a regular file or is a link.
    ``dir_fd``: a relative ``path`` is in that directory (`open_dir`)."""
    fd = _open_regular(path, os.O_RDONLY, "read", dir_fd=dir_fd)
    try:
        return os.pread(fd, max(0, max_bytes), offset)
    finally:
        os.close(fd)


def open_dir(path: Path) -> int:
    """A descriptor of the directory ``path``, to read files in it by name (`read_bytes`'s
    ``dir_fd``) so that a link put in place of the directory later is never followed
    either; a link there now is refused (`NotADirectoryError`, as a file there is). The
    caller closes it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_append(path: Path) -> int:
    """A file descriptor appending to ``path`` (created if missing), never through a link
    put in its place (`NotARegularFile`)."""
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "written")
    os.set_blocking(fd, True)
    return fd


def own_dir(path: Path) -> Path:
    """``path`` as a directory of this process's own making when something else stood there
    (a link, a file: removed, never followed); an existing real directory is kept."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """``data`` as the file ``path``, whatever stood there (a link is replaced, never
    followed): written to a new name beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_text(path: Path, max_bytes: int) -> str:
    """`read_bytes` from the start, decoded (undecodable bytes replaced)."""
    return read_bytes(path, max_bytes).decode("utf-8", errors="replace")
