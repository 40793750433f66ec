"""The installed shim libraries depend on no MPI library and load into any process.

Each build (`rankpack.profile.shim.shim_library`) is read as an ELF file, here in Python (a
unit test starts no process; tests/integration/test_shim_abi.py asks binutils' readelf the
same and preloads the libraries for real): it needs no libmpi (it binds to the solver's own
MPI, docs/shim.md), asks for no immediate binding, and every symbol it takes from elsewhere
is either weak (an MPI function: unbound where there is no MPI) or versioned (the C library's),
so that loading it into a process without MPI can never fail. A library that is not built
fails the test: `make -C shim install` (setup.sh does) builds both.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankpack.profile.shim import FLAVOURS, shim_library

C_LIBRARY = frozenset({"libc.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"})
"""What a build may need: the C library and the dynamic loader, nothing else."""

SHT_DYNSYM, SHT_DYNAMIC, SHT_GNU_VERSYM = 11, 6, 0x6FFFFFFF
DT_NEEDED, DT_BIND_NOW, DT_FLAGS, DT_FLAGS_1 = 1, 24, 30, 0x6FFFFFFB
DF_BIND_NOW, DF_1_NOW = 0x8, 0x1
STB_WEAK = 2


@dataclass(frozen=True)
class Dynamic:
    """What the dynamic loader reads of a shared library."""

    needed: list[str]
    bind_now: bool
    undefined: dict[str, tuple[bool, bool]]
    """Undefined symbol -> (weak, versioned)."""


def read_dynamic(data: bytes) -> Dynamic:
    """The dynamic section and the undefined dynamic symbols of a 64-bit little-endian ELF
    file (the machines rankpack builds for)."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit LE ELF file"
    shoff, shentsize, shnum = (struct.unpack_from("<Q", data, 0x28)[0],
                               *struct.unpack_from("<HH", data, 0x3A))  # fmt: skip
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]

    def body(index: int) -> bytes:
        offset, size = sections[index][4], sections[index][5]
        return data[offset : offset + size]

    def string(table: bytes, at: int) -> str:
        return table[at : table.index(b"\0", at)].decode()

    by_type = {s[1]: i for i, s in enumerate(sections)}
    dynamic, dynstr = body(by_type[SHT_DYNAMIC]), body(sections[by_type[SHT_DYNAMIC]][6])
    needed, bind_now = [], False
    for tag, value in struct.iter_unpack("<qQ", dynamic):
        if tag == DT_NEEDED:
            needed.append(string(dynstr, value))
        bind_now |= (tag == DT_BIND_NOW or (tag == DT_FLAGS and value & DF_BIND_NOW)
                     or (tag == DT_FLAGS_1 and value & DF_1_NOW))  # fmt: skip
    symbols = list(struct.iter_unpack("<IBBHQQ", body(by_type[SHT_DYNSYM])))
    versions = [v for (v,) in struct.iter_unpack("<H", body(by_type[SHT_GNU_VERSYM]))]
    undefined = {
        string(dynstr, name): (info >> 4 == STB_WEAK, version & 0x7FFF >= 2)
        for (name, info, _, shndx, _, _), version in zip(symbols, versions, strict=True)
        if shndx == 0 and name != 0
    }
    return Dynamic(needed, bool(bind_now), undefined)


@pytest.fixture(scope="module", params=FLAVOURS)
def library(request: pytest.FixtureRequest) -> tuple[Path, Dynamic]:
    path = shim_library(request.param)  # a UserError saying how to build it if missing
    return path, read_dynamic(path.read_bytes())


def test_a_build_needs_no_mpi_library(library: tuple[Path, Dynamic]) -> None:
    path, dynamic = library
    mpi = [n for n in dynamic.needed if n.startswith(("libmpi", "libmpich"))]
    assert not mpi, f"{path.name} needs {mpi}: it must bind to the solver's MPI (shim/Makefile)"
    assert "libc.so.6" in dynamic.needed
    assert set(dynamic.needed) <= C_LIBRARY, f"{path.name} needs more than the C library"


def test_a_build_binds_lazily_and_takes_only_weak_or_versioned_symbols(
    library: tuple[Path, Dynamic],
) -> None:
    path, dynamic = library
    assert not dynamic.bind_now, f"{path.name} is linked -z now: it must bind lazily"
    strong = sorted(n for n, (weak, versioned) in dynamic.undefined.items()
                    if not weak and not versioned)  # fmt: skip
    assert not strong, (
        f"{path.name} needs {strong} from a library it does not link: declare them RP_WEAK "
        "(shim/rankpack_pmpi.c) or look them up at MPI_Init"
    )
    # The reader tells both apart: an MPI function is weak and unversioned, the C library's
    # are strong and versioned.
    assert dynamic.undefined["PMPI_Init"] == (True, False)
    assert dynamic.undefined["getenv"] == (False, True)
