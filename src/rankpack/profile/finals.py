"""The shim's per-rank final records: what each rank totalled when it ended.

With ``RANKPACK_SHIM_FINAL_DIR`` set, the shim (``shim/rankpack_pmpi.c``) writes
``rank-<r>.final.json`` once per rank, at MPI_Finalize or at exit (docs/shim.md, "The final
record"). The live records may vanish with the ranks (a rank pod's own volume); these sit in
the run directory, so a controller that adopts a run which ended while it was away still has
each rank's duty cycle and CPU-seconds. The backends read them (`read_finals`) once a
simulation has ended and deliver them in its observation.

The files are written by the user's processes: `read_finals` reads only the names it
expects, at most `MAX_BYTES` of each, never through a link (the directory's or a file's),
and keeps a file only if it is exactly the schema below, for the rank its name says, of a
run of as many ranks as asked; anything else is left out, never raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack import untrusted
from rankpack.core.actions import WAIT_MODES

FINAL_VERSION = 1
MAX_BYTES = 4096
"""The most of a file read; a larger one is not a final record the shim wrote (~250 bytes)."""
MAX_NS = 10**18
"""Every count of nanoseconds (and every other counter) is below this: ~31 years."""
MAX_INT32 = 2**31
"""Ranks, world sizes and pids are C ints."""

_INT_FIELDS = (
    "version",
    "rank",
    "world_size",
    "pid",
    "compute_ns",
    "mpi_ns",
    "cpu_ns",
    "wall_ns",
    "finalized",
    "wait_mode",
    "wait_switches",
    "sleeps",
)
_FIELDS = frozenset({*_INT_FIELDS, "host"})
_HOST = re.compile(r"[A-Za-z0-9._-]{0,63}")


def final_name(rank: int) -> str:
    """The file name of rank ``rank``'s final record (in the final directory)."""
    return f"rank-{rank}.final.json"


@dataclass(frozen=True)
class FinalRecord:
    """One rank's totals as its shim wrote them when it ended."""

    rank: int
    compute_s: float
    """Wall time outside MPI, from MPI_Init's return to the end."""
    mpi_s: float
    """Wall time inside (intercepted) MPI calls."""
    cpu_s: float
    """CPU time of the rank's whole process (user + system, MPI's own threads included)."""
    wall_s: float
    """From MPI_Init's return to the end."""
    finalized: bool
    """True: written at MPI_Finalize; False: at exit, MPI_Finalize never ran."""
    wait_mode: str
    """The wait mode of the rank's last wait (``spin``, ``polite``, ``adaptive``)."""
    wait_switches: int
    """How often the rank took up a new wait mode."""

    @property
    def duty(self) -> float | None:
        """compute / (compute + MPI) over the whole run; None if the rank timed nothing."""
        busy = self.compute_s + self.mpi_s
        return self.compute_s / busy if busy > 0 else None


def read_finals(directory: Path, n_ranks: int) -> dict[int, FinalRecord]:
    """The final records of ranks ``0..n_ranks-1`` in ``directory``, by rank. A rank whose
    file is missing, larger than `MAX_BYTES`, a link or anything but a regular file, or not
    a valid record of that rank in a run of ``n_ranks`` ranks is left out; no directory (or
    a link in its place) gives none. Never raises for what the files hold."""
    try:
        dir_fd = untrusted.open_dir(directory)
    except OSError:
        return {}
    found: dict[int, FinalRecord] = {}
    try:
        for rank in range(n_ranks):
            with contextlib.suppress(OSError):
                data = untrusted.read_bytes(Path(final_name(rank)), MAX_BYTES + 1, dir_fd=dir_fd)
                record = parse_final(data, rank, n_ranks)
                if record is not None:
                    found[rank] = record
    finally:
        os.close(dir_fd)
    return found


def parse_final(data: bytes, rank: int, n_ranks: int) -> FinalRecord | None:
    """``data`` as rank ``rank``'s final record in a run of ``n_ranks`` ranks; None if it is
    not exactly one (too long, not JSON, a field missing, extra, of another type or out of
    bounds, another rank's, another run size's)."""
    if len(data) > MAX_BYTES:
        return None
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return None
    values = _checked(raw)
    if values is None or values["rank"] != rank or values["world_size"] != n_ranks:
        return None
    return FinalRecord(
        rank=rank,
        compute_s=values["compute_ns"] / 1e9,
        mpi_s=values["mpi_ns"] / 1e9,
        cpu_s=values["cpu_ns"] / 1e9,
        wall_s=values["wall_ns"] / 1e9,
        finalized=values["finalized"] == 1,
        wait_mode=WAIT_MODES[values["wait_mode"]],
        wait_switches=values["wait_switches"],
    )


def _checked(raw: Any) -> dict[str, int] | None:
    """The integer fields of ``raw`` if it is a version-1 record with exactly the fields of
    one, each of its type and within its bounds; else None."""
    if not isinstance(raw, dict) or set(raw) != _FIELDS:
        return None
    host = raw["host"]
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        return None
    values: dict[str, int] = {}
    for name in _INT_FIELDS:
        value = raw[name]
        if type(value) is not int or not 0 <= value < MAX_NS:  # (a bool is not an int here)
            return None
        values[name] = value
    if (
        values["version"] != FINAL_VERSION
        or not 0 < values["world_size"] < MAX_INT32
        or not 0 < values["pid"] < MAX_INT32
        or values["finalized"] not in (0, 1)
        or values["wait_mode"] >= len(WAIT_MODES)
    ):
        return None
    return values
