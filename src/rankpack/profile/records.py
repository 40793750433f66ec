"""Consistent snapshots of the shim's per-rank live records (``shim/rankpack_record.h``).

Each rank's shim publishes ``<live dir>/rank-<r>.rec`` under a sequence lock. A reader copies
the bytes and keeps the copy only if the sequence number was even and unchanged across the
copy; otherwise it retries a bounded number of times and gives up with ``None`` rather than
wait, so reading never blocks (or slows) the solver. Called by `rankpack.profile.sampling`.

`RECORD_FIELDS` is the one Python copy of the C layout; a unit test compares it with the
offsets the C compiler gives (``shim/tests/record_layout.c``).

`set_wait_mode_fd` is the one write in the other direction (`set_wait_mode` and
`set_wait_modes` by path, the Kubernetes node reader by descriptor, all call it): it
changes the record's control word ``wait_ctl``, which the shim reads at the start of every
wait, so a running simulation's ranks switch between spin, polite and adaptive waiting
without a restart.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.core.actions import WAIT_MODES, parse_wait_mode
from rankpack.errors import UserError

RECORD_MAGIC = 0x4B505052
RECORD_VERSION = 2
MAX_FUNCS = 48
FUNC_NAME_LEN = 24
HOST_LEN = 64
WAIT_MODE_NAMES = WAIT_MODES
"""A wait mode's index here is its code in the shim's control word."""

# (field, struct format) in C declaration order; the struct has no implicit padding.
RECORD_FIELDS: tuple[tuple[str, str], ...] = (
    ("seq", "Q"),
    ("magic", "I"),
    ("version", "I"),
    ("record_size", "I"),
    ("n_funcs", "I"),
    ("rank", "i"),
    ("world_size", "i"),
    ("pid", "i"),
    ("wait_ctl", "I"),
    ("host", f"{HOST_LEN}s"),
    ("func_names", f"{MAX_FUNCS * FUNC_NAME_LEN}s"),
    ("t_start_ns", "Q"),
    ("window_ns", "Q"),
    ("interval_ns", "Q"),
    ("t_update_ns", "Q"),
    ("updates", "Q"),
    ("compute_ns", "Q"),
    ("mpi_ns", "Q"),
    ("window_end_ns", "Q"),
    ("window_compute_ns", "Q"),
    ("window_mpi_ns", "Q"),
    ("t_last_change_ns", "Q"),
    ("in_func", "i"),
    ("finalized", "I"),
    ("wait_mode", "I"),
    ("wait_switches", "I"),
    ("sleeps", "Q"),
    ("sleep_ns", "Q"),
    ("spin_limit_ns", "Q"),
    ("trace_events", "Q"),
    ("trace_dropped", "Q"),
    ("funcs", f"{MAX_FUNCS * 2}Q"),
)
_STRUCT = struct.Struct("<" + "".join(fmt for _, fmt in RECORD_FIELDS))
RECORD_SIZE = _STRUCT.size


def _offsets() -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    offset = 0
    for name, fmt in RECORD_FIELDS:
        size = struct.calcsize("<" + fmt)
        out[name] = (offset, size)
        offset += size
    return out


RECORD_OFFSETS = _offsets()
"""field -> (offset, size) in bytes."""
_SEQ = struct.Struct("<Q")


@dataclass(frozen=True)
class FuncStats:
    name: str
    calls: int
    ns: int


@dataclass(frozen=True)
class RankRecord:
    """One consistent version of a rank's live record. Times: CLOCK_MONOTONIC ns."""

    rank: int
    world_size: int
    pid: int
    host: str
    wait_mode: str
    """The wait mode in effect at the rank's last wait (before its first wait: spin)."""
    seq: int
    t_start_ns: int
    """When MPI_Init returned in the rank."""
    t_update_ns: int
    """When this version was published (compare with time.monotonic_ns())."""
    updates: int
    compute_ns: int
    """Cumulative time outside intercepted MPI calls since MPI_Init."""
    mpi_ns: int
    """Cumulative time inside intercepted MPI calls."""
    window_ns: int
    window_end_ns: int
    window_compute_ns: int
    window_mpi_ns: int
    t_last_change_ns: int
    in_func: str | None
    """The MPI function the rank is inside, None while it computes."""
    finalized: bool
    sleeps: int
    sleep_ns: int
    spin_limit_ns: int
    trace_events: int
    trace_dropped: int
    funcs: tuple[FuncStats, ...]
    wait_mode_requested: str = "spin"
    """The control word: the mode asked for (RANKPACK_SHIM_WAIT, then `set_wait_mode`)."""
    wait_switches: int = 0
    """How many times the rank saw the requested mode change."""

    @property
    def window_duty(self) -> float | None:
        """Duty cycle over the shim's last completed window; None before the first."""
        total = self.window_compute_ns + self.window_mpi_ns
        return self.window_compute_ns / total if self.window_end_ns and total else None

    @property
    def duty(self) -> float | None:
        """Duty cycle since MPI_Init (includes start-up)."""
        total = self.compute_ns + self.mpi_ns
        return self.compute_ns / total if total else None


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _mode_name(mode: int) -> str:
    return WAIT_MODE_NAMES[mode] if mode < len(WAIT_MODE_NAMES) else str(mode)


def parse_record(data: bytes) -> RankRecord:
    """Decode one record copy (already known to be consistent)."""
    values: dict[str, Any] = dict(zip((n for n, _ in RECORD_FIELDS), _unpack(data), strict=True))
    n_funcs = min(int(values["n_funcs"]), MAX_FUNCS)
    names_raw = values["func_names"]
    assert isinstance(names_raw, bytes)
    names = [_cstr(names_raw[i * FUNC_NAME_LEN : (i + 1) * FUNC_NAME_LEN]) for i in range(n_funcs)]
    funcs_raw = values["funcs"]
    assert isinstance(funcs_raw, tuple)
    funcs = tuple(
        FuncStats(names[i], int(funcs_raw[2 * i]), int(funcs_raw[2 * i + 1]))
        for i in range(n_funcs)
    )
    mode = int(values["wait_mode"])
    in_func = int(values["in_func"])
    host = values["host"]
    assert isinstance(host, bytes)
    return RankRecord(
        rank=int(values["rank"]),
        world_size=int(values["world_size"]),
        pid=int(values["pid"]),
        host=_cstr(host),
        wait_mode=_mode_name(mode),
        wait_mode_requested=_mode_name(int(values["wait_ctl"])),
        wait_switches=int(values["wait_switches"]),
        seq=int(values["seq"]),
        t_start_ns=int(values["t_start_ns"]),
        t_update_ns=int(values["t_update_ns"]),
        updates=int(values["updates"]),
        compute_ns=int(values["compute_ns"]),
        mpi_ns=int(values["mpi_ns"]),
        window_ns=int(values["window_ns"]),
        window_end_ns=int(values["window_end_ns"]),
        window_compute_ns=int(values["window_compute_ns"]),
        window_mpi_ns=int(values["window_mpi_ns"]),
        t_last_change_ns=int(values["t_last_change_ns"]),
        in_func=names[in_func - 1] if 0 < in_func <= n_funcs else None,
        finalized=bool(values["finalized"]),
        sleeps=int(values["sleeps"]),
        sleep_ns=int(values["sleep_ns"]),
        spin_limit_ns=int(values["spin_limit_ns"]),
        trace_events=int(values["trace_events"]),
        trace_dropped=int(values["trace_dropped"]),
        funcs=funcs,
    )


def _unpack(data: bytes) -> list[Any]:
    flat = list(_STRUCT.unpack_from(data))
    # The funcs array unpacks into 2*MAX_FUNCS values; regroup it into one tuple.
    n_scalar = len(RECORD_FIELDS) - 1
    return [*flat[:n_scalar], tuple(flat[n_scalar:])]


class RecordReader:
    """Reads one rank's record file repeatedly (keeps it mapped). Not thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mm: mmap.mmap | None = None
        self._ino: int | None = None

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _map(self) -> mmap.mmap | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.close()
            return None
        if self._mm is not None and st.st_ino == self._ino:
            return self._mm
        self.close()
        if st.st_size < RECORD_SIZE:
            return None
        with open(self.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), RECORD_SIZE, access=mmap.ACCESS_READ)
        self._ino = st.st_ino
        return self._mm

    def snapshot(self, max_tries: int = 1000) -> RankRecord | None:
        """A consistent copy, or None if there is none yet (or the writer kept changing it)."""
        mm = self._map()
        if mm is None:
            return None
        for _ in range(max_tries):
            (seq1,) = _SEQ.unpack_from(mm, 0)
            if seq1 < 2 or seq1 & 1:
                if seq1 == 0:
                    return None  # created but never published
                continue
            data = mm[:RECORD_SIZE]
            (seq2,) = _SEQ.unpack_from(mm, 0)
            if seq2 != seq1:
                continue
            _check_header(data, self.path)
            return parse_record(data)
        return None


def _check_header(data: bytes, path: Path) -> None:
    magic, version, size = struct.unpack_from("<III", data, RECORD_OFFSETS["magic"][0])
    if magic != RECORD_MAGIC:
        raise UserError(f"{path} is not a rankpack live record (bad magic {magic:#x})")
    if version != RECORD_VERSION or size != RECORD_SIZE:
        raise UserError(
            f"{path} has record version {version} ({size} bytes); this rankpack reads version "
            f"{RECORD_VERSION} ({RECORD_SIZE} bytes): rebuild the shim with `make -C shim install`"
        )


def set_wait_mode(record_path: Path, mode: str) -> None:
    """Ask the rank that publishes `record_path` to wait in `mode` (spin, polite, adaptive).

    Writes the record's control word (`set_wait_mode_fd`, the one writer of it): the shim
    picks it up at the start of its next wait (no restart, no signal). Raises UserError
    if the file is not a published record of this version.
    """
    wait = parse_wait_mode(mode)
    try:
        f = open(record_path, "r+b")  # noqa: SIM115 - closed by `with f` below
    except FileNotFoundError:
        raise UserError(f"{record_path}: no live record (has the rank called MPI_Init?)") from None
    with f:
        if os.fstat(f.fileno()).st_size < RECORD_SIZE:
            raise UserError(f"{record_path}: the record is not published yet; try again")
        set_wait_mode_fd(f.fileno(), record_path, wait)


def set_wait_modes(live_dir: Path, n_ranks: int, mode: str) -> None:
    """`set_wait_mode` on the records of ranks 0..n_ranks-1 in ``live_dir`` (a whole job).

    Every record is checked before any is written, so a job whose ranks have not all
    published yet is left unchanged (UserError; try again later)."""
    parse_wait_mode(mode)
    paths = [record_path(live_dir, r) for r in range(n_ranks)]
    for rank, path in enumerate(paths):
        if not _published(path):
            raise UserError(
                f"rank {rank}'s live record {path} is not published yet (has the rank called"
                " MPI_Init?); try again"
            )
    for path in paths:
        set_wait_mode(path, mode)


def _published(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < RECORD_SIZE:
                return False
            head = f.read(_SEQ.size)
    except OSError:
        return False
    return len(head) == _SEQ.size and _SEQ.unpack_from(head, 0)[0] >= 2


# -- through a descriptor: the node agent's reads and writes of a pod's record --------------


def snapshot_fd(fd: int, name: Path, max_tries: int = 100) -> RankRecord | None:
    """A consistent copy of the record open at ``fd`` (``name`` only for messages), read
    with ``pread`` rather than a mapping: a file another user's process may truncate at any
    time cannot fault the reader (a mapping past the end of a file raises SIGBUS). None when
    it is not published yet, too short, or the writer kept changing it for ``max_tries``
    copies (never waits). UserError if it is not a record of this version."""
    for _ in range(max_tries):
        seq1 = _seq_at(fd)
        if seq1 is None or seq1 == 0:
            return None  # too short, or created but never published
        if seq1 < 2 or seq1 & 1:
            continue
        data = os.pread(fd, RECORD_SIZE, 0)
        if len(data) < RECORD_SIZE:
            return None
        if _seq_at(fd) != seq1 or _SEQ.unpack_from(data, 0)[0] != seq1:
            continue
        _check_header(data, name)
        return parse_record(data)
    return None


def _seq_at(fd: int) -> int | None:
    head = os.pread(fd, _SEQ.size, 0)
    return int(_SEQ.unpack_from(head, 0)[0]) if len(head) == _SEQ.size else None


def set_wait_mode_fd(fd: int, name: Path, mode: str) -> None:
    """The one writer of a record's control word: the record open (read-write) at ``fd``
    (``name`` only for messages) asked to wait in ``mode``, with one ``pwrite`` of the word
    rather than a shared mapping (see `snapshot_fd`: the file may be another user's, and a
    mapping past a truncated end faults). The codes are 0, 1 and 2: only the word's lowest
    byte ever changes, so the shim's 32-bit load cannot see a torn value whatever width the
    kernel copies in. `set_wait_mode` (a path) and the node reader (a pod's record) call it.
    UserError if the file is not a published record of this version."""
    wait = parse_wait_mode(mode)
    data = os.pread(fd, RECORD_SIZE, 0)
    if len(data) < RECORD_SIZE or _SEQ.unpack_from(data, 0)[0] < 2:
        raise UserError(f"{name}: the record is not published yet; try again")
    _check_header(data, name)
    offset, size = RECORD_OFFSETS["wait_ctl"]
    word = struct.pack("<I", WAIT_MODE_NAMES.index(wait))
    if os.pwrite(fd, word, offset) != size:
        raise UserError(f"{name}: the control word could not be written")


def read_record(path: Path, max_tries: int = 1000) -> RankRecord | None:
    with RecordReader(path) as reader:
        return reader.snapshot(max_tries)


def record_path(live_dir: Path, rank: int) -> Path:
    return live_dir / f"rank-{rank}.rec"


def read_records(live_dir: Path, n_ranks: int | None = None) -> dict[int, RankRecord]:
    """Snapshots of every rank found in a live directory (ranks not yet published are absent)."""
    if n_ranks is None:
        paths = sorted(live_dir.glob("rank-*.rec"))
    else:
        paths = [record_path(live_dir, r) for r in range(n_ranks)]
    out: dict[int, RankRecord] = {}
    for path in paths:
        rec = read_record(path)
        if rec is not None:
            out[rec.rank] = rec
    return out
