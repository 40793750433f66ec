"""`rankpack.case.mpiabi.family_of`: the MPI ABI family a program links, from recorded
listings of the dynamic loader (``ld.so --list`` / ``ldd``), and what it makes of anything
else (junk, decoys, more than it reads)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.case.mpiabi import FAMILIES, MAX_LISTING_CHARS, MAX_LISTING_LINES, family_of
from rankpack.profile.shim import FLAVOURS

# Debian 12's simpleFoam (OpenFOAM 2206, Open MPI 4.1.4), trimmed.
OPENMPI_4 = """\
\tlinux-vdso.so.1 (0x00007f843e2f3000)
\tlibfiniteVolume.so => /lib/libfiniteVolume.so (0x00007f843ba00000)
\tlibOpenFOAM.so => /lib/libOpenFOAM.so (0x00007f8439200000)
\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f8438e00000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f843901e000)
\tlibPstream.so => /lib/libPstream.so (0x00007f843e11b000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f843e2f5000)
\tlibmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x00007f84378c1000)
\tlibopen-rte.so.40 => /lib/x86_64-linux-gnu/libopen-rte.so.40 (0x00007f8439dba000)
\tlibopen-pal.so.40 => /lib/x86_64-linux-gnu/libopen-pal.so.40 (0x00007f8438949000)
\tlibhwloc.so.15 => /lib/x86_64-linux-gnu/libhwloc.so.15 (0x00007f843ada3000)
"""

# An OpenFOAM v2312 build on Debian 13 (Open MPI 5: libopen-pal.so.80, PMIx, no ORTE).
OPENMPI_5 = """\
\tlinux-vdso.so.1 (0x00007ffd5b9e2000)
\tlibfiniteVolume.so => /usr/lib/openfoam/openfoam2312/platforms/linux64GccDPInt32Opt/lib/libfiniteVolume.so (0x00007f2a1c000000)
\tlibPstream.so => /usr/lib/openfoam/openfoam2312/platforms/linux64GccDPInt32Opt/lib/sys-openmpi/libPstream.so (0x00007f2a1e4a0000)
\tlibmpi.so.40 => /usr/lib/x86_64-linux-gnu/libmpi.so.40 (0x00007f2a1b800000)
\tlibopen-pal.so.80 => /usr/lib/x86_64-linux-gnu/libopen-pal.so.80 (0x00007f2a1b600000)
\tlibpmix.so.2 => /usr/lib/x86_64-linux-gnu/libpmix.so.2 (0x00007f2a1b400000)
\tlibc.so.6 => /usr/lib/x86_64-linux-gnu/libc.so.6 (0x00007f2a1b200000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f2a1e4e0000)
"""  # noqa: E501

# Debian 12's MPICH 4.0.2 (ch4:ucx).
MPICH = """\
\tlinux-vdso.so.1 (0x00007fff4a7e5000)
\tlibmpich.so.12 => /lib/x86_64-linux-gnu/libmpich.so.12 (0x00007f0a5f200000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0a5f01f000)
\tlibucp.so.0 => /lib/x86_64-linux-gnu/libucp.so.0 (0x00007f0a5ef4e000)
\tlibhwloc.so.15 => /lib/x86_64-linux-gnu/libhwloc.so.15 (0x00007f0a5eef2000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0a60745000)
"""

# Intel MPI (oneAPI) names its library libmpi.so.12, as MPICH does upstream and MVAPICH.
INTEL_MPI = """\
\tlinux-vdso.so.1 (0x00007ffc3d1f4000)
\tlibmpifort.so.12 => /opt/intel/oneapi/mpi/2021.11/lib/libmpifort.so.12 (0x00007f5c2a400000)
\tlibmpi.so.12 => /opt/intel/oneapi/mpi/2021.11/lib/libmpi.so.12 (0x00007f5c29a00000)
\tlibfabric.so.1 => /opt/intel/oneapi/mpi/2021.11/opt/mpi/libfabric/lib/libfabric.so.1 (0x00007f5c29600000)
\tlibc.so.6 => /lib64/libc.so.6 (0x00007f5c29200000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f5c2a7c0000)
"""  # noqa: E501

# python3 on Debian 12: links no MPI.
NONE = """\
\tlinux-vdso.so.1 (0x00007ffe2b5f6000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f9d1c2f1000)
\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f9d1c2d2000)
\tlibexpat.so.1 => /lib/x86_64-linux-gnu/libexpat.so.1 (0x00007f9d1c2a7000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f9d1c0c6000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f9d1c91b000)
"""


@pytest.mark.parametrize(
    ("listing", "family"),
    [
        pytest.param(OPENMPI_4, "openmpi", id="openmpi-4"),
        pytest.param(OPENMPI_5, "openmpi", id="openmpi-5"),
        pytest.param(MPICH, "mpich", id="mpich"),
        pytest.param(INTEL_MPI, "mpich", id="intel-mpi"),
        pytest.param("\tlibmpi.so.12 => /opt/mvapich2/lib/libmpi.so.12 (0x1)\n", "mpich",
                     id="mvapich"),
        pytest.param(NONE, None, id="none"),
        pytest.param("", None, id="empty"),
        # linked but not found where the listing was made: still what the program links
        pytest.param("\tlibmpi.so.40 => not found\n", "openmpi", id="not-found"),
        # a library needed by its path
        pytest.param("\t/opt/ompi/lib/libmpi.so.40 (0x00007f84378c1000)\n", "openmpi",
                     id="by-path"),
        pytest.param(OPENMPI_4.replace("\n", "\r\n"), "openmpi", id="crlf"),
    ],
)  # fmt: skip
def test_the_family_of_a_recorded_listing(listing: str, family: str | None) -> None:
    assert family_of(listing) == family


@pytest.mark.parametrize(
    "listing",
    [
        "not a dynamic executable\n",
        "\tstatically linked\n",
        "/etc/passwd: error while loading shared libraries: /etc/passwd: invalid ELF header\n",
        # names that only look like an MPI library's
        "\tlibmpi_cxx.so.40 => /lib/libmpi_cxx.so.40 (0x1)\n",
        "\tlibmpi.so.400 => /lib/libmpi.so.400 (0x1)\n",
        "\tlibmpich.so.120 => /lib/libmpich.so.120 (0x1)\n",
        "\tmylibmpi.so.40 => /lib/mylibmpi.so.40 (0x1)\n",
        "\tlibmpi.so => /lib/libmpi.so.40 (0x1)\n",  # only the needed name counts
        "\tlibfoo.so.1 libmpi.so.40\n",
        "\x00\x7fELF\x02\x01\x01 libmpi.so.40",
    ],
)
def test_junk_and_decoys_are_no_family(listing: str) -> None:
    assert family_of(listing) is None


def test_a_program_linking_both_families_has_none() -> None:
    assert family_of(OPENMPI_4 + MPICH) is None


def test_every_family_is_a_shim_flavour() -> None:
    assert set(FAMILIES.values()) == set(FLAVOURS)


def test_only_the_first_lines_and_characters_are_read() -> None:
    filler = "\tlibfoo.so.1 => /lib/libfoo.so.1 (0x1)\n"
    line = "\tlibmpi.so.40 => /lib/libmpi.so.40 (0x1)\n"
    assert family_of(filler * (MAX_LISTING_LINES - 1) + line) == "openmpi"
    assert family_of(filler * MAX_LISTING_LINES + line) is None
    long_filler = "x" * 1000 + "\n"
    within = MAX_LISTING_CHARS // len(long_filler) - 1
    assert within < MAX_LISTING_LINES
    assert family_of(long_filler * within + line) == "openmpi"
    assert family_of("x" * MAX_LISTING_CHARS + "\n" + line) is None


def test_a_huge_listing_is_read_only_as_far_as_the_bounds() -> None:
    huge = "\tlibmpi.so.40 => /lib/libmpi.so.40 (0x1)\n" + "y" * 50_000_000
    assert family_of(huge) == "openmpi"
    assert family_of("z" * 50_000_000) is None
    assert family_of("\n" * 50_000_000 + "\tlibmpi.so.40\n") is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([*FAMILIES, "libc.so.6", "=>", "\t", "\n", "/", " "])).map("".join)
       | st.text(max_size=200))  # fmt: skip
def test_any_text_gives_a_family_or_none(text: str) -> None:
    assert family_of(text) in (None, *FLAVOURS)
