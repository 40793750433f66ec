"""Which MPI ABI family a program links, read from the dynamic loader's listing of it.

The PMPI shim is built once per ABI family and binds to the MPI the solver itself loaded
(docs/shim.md, "ABI families"), so a launcher preloads the build of the solver's family:
`family_of` reads that family from the listing of the solver (``ld.so --list PROGRAM`` or
``ldd PROGRAM``, possibly made inside a user's image, so it is read bounded), and
`listing_of` makes such a listing in this process's environment (staging lists the case's
solver where its OpenFOAM is, `staging.detect_mpi`: on a cluster, in the Simulation's image
through `foamexec`, with the same bounds and `read_listing`). Pure but for `listing_of`.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path, PurePosixPath

from rankpack.case import foamtools
from rankpack.errors import UserError

FAMILIES: dict[str, str] = {
    "libmpi.so.40": "openmpi",  # Open MPI 3.x to 5.x
    "libmpich.so.12": "mpich",  # MPICH as Debian ships it
    "libmpi.so.12": "mpich",  # MPICH's own name for it; Intel MPI, MVAPICH
}
"""Shared-object name (as the program needs it) -> the shim flavour of its ABI family
(`rankpack.profile.shim.FLAVOURS`)."""

MAX_LISTING_CHARS = 64 * 1024
"""At most this much of a listing is read (Debian's simpleFoam: 45 libraries, 3.2 KiB)."""
MAX_LISTING_LINES = 512
"""At most this many lines of a listing are looked at (one library a line)."""

LOADERS: dict[str, Path] = {
    "x86_64": Path("/lib64/ld-linux-x86-64.so.2"),
    "aarch64": Path("/lib/ld-linux-aarch64.so.1"),
}
"""This machine's dynamic loader, by `platform.machine()`, for `listing_of`."""
LISTING_TIMEOUT_S = 10.0
"""How long `listing_of` waits for the loader (it maps the libraries, runs no code of them)."""


def family_of(listing: str) -> str | None:
    """The ABI family (``"openmpi"`` or ``"mpich"``) of the MPI a program links, from the
    loader's listing of it; None if it links neither (or, as no working program does, both).

    A listing has a line per library, the name the program needs first:
    ``\\tlibmpi.so.40 => /usr/lib/x86_64-linux-gnu/libmpi.so.40 (0x7f...)``; also
    ``libmpi.so.12 => not found`` (the library is linked even where it is not found) and
    ``/opt/mpi/lib/libmpi.so.40 (0x...)`` (a library needed by path). Only the first
    `MAX_LISTING_CHARS` characters and `MAX_LISTING_LINES` lines are read; anything else on
    a line, and any line that is not such an entry, is ignored.
    """
    found: set[str] = set()
    for line in listing[:MAX_LISTING_CHARS].splitlines()[:MAX_LISTING_LINES]:
        words = line.split(maxsplit=1)
        if words:
            family = FAMILIES.get(PurePosixPath(words[0]).name)
            if family is not None:
                found.add(family)
    return found.pop() if len(found) == 1 else None


def this_loader() -> Path:
    """This machine's dynamic loader (`LOADERS`); `UserError` if none is known."""
    loader = LOADERS.get(platform.machine())
    if loader is None:
        raise UserError(f"no known dynamic loader for {platform.machine()}; give the loader's path")
    return loader


def listing_of(program: Path, loader: Path | None = None) -> str:
    """The dynamic loader's listing of ``program`` (``LOADER --list PROGRAM``, no shell), for
    `family_of`. ``loader``: this machine's (`this_loader`) unless given; running the loader
    itself never runs the program's own interpreter. The loader gets this process's
    environment (its ``LD_LIBRARY_PATH`` finds the solver's libraries) without ``LD_PRELOAD``,
    at most `LISTING_TIMEOUT_S`, and only the first `MAX_LISTING_CHARS` of its output are
    kept. `UserError` (one line) if it cannot list the program.
    """
    loader = this_loader() if loader is None else loader
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        rc, out = foamtools.run_bounded([str(loader), "--list", str(program)], env,
                                        LISTING_TIMEOUT_S, MAX_LISTING_CHARS)  # fmt: skip
    except OSError as exc:
        raise UserError(f"cannot run the dynamic loader {loader}: {exc.strerror}") from None
    return read_listing(rc, out, loader, program)


def read_listing(rc: int | None, out: bytes, loader: Path, program: Path | str) -> str:
    """The listing of ``program`` as `foamtools.run_bounded` returned the output of
    ``loader --list``: its text, or `UserError` when it timed out or failed (a listing cut
    at `MAX_LISTING_CHARS` is kept)."""
    text = out.decode("utf-8", errors="replace")
    if rc is None:
        raise UserError(f"{loader} --list {program} did not finish in {LISTING_TIMEOUT_S:g} s")
    if rc != 0 and len(out) < MAX_LISTING_CHARS:
        last = text.strip().splitlines()[-1:] or [f"the loader exited with status {rc}"]
        raise UserError(f"cannot list the libraries of {program}: {last[0][:200]}")
    return text
