"""The shim built once per MPI ABI family, depending on no MPI of its own (docs/shim.md, "ABI
families"): binutils sees no libmpi in it, it loads harmlessly into processes without MPI
(LD_PRELOAD reaches the shells and launchers around a solver), it binds to an MPI that the
program loaded out of its sight (dlopen RTLD_LOCAL, as Python loads mpi4py), it refuses an
MPI of the other family in one line, and `rankpack.case.mpiabi` reads the family of this
machine's programs. The MPI programs themselves run in test_shim.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from rankpack.case import mpiabi
from rankpack.case.mpiabi import family_of, listing_of
from rankpack.errors import UserError
from rankpack.profile.records import read_records
from tests.integration.test_shim import mpirun

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
BUILD = SHIM / "build"
LIB = REPO / "src" / "rankpack" / "_lib"
FLAVOURS = ["openmpi", "mpich"]
NO_MPI = [["/bin/true"], ["/bin/sh", "-c", "true"], ["/bin/sh", "-c", "echo ok"]]


@pytest.fixture(scope="module")
def built() -> Path:
    subprocess.run(["make", "-s", "-C", str(SHIM), "all", "install"], check=True, timeout=300)
    return BUILD


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_readelf_sees_no_mpi_library_and_no_immediate_binding(built: Path, flavour: str) -> None:
    """binutils' view of the installed library (the unit tier reads the same in Python)."""
    path = LIB / f"librankpack_pmpi.{flavour}.so"
    try:
        out = subprocess.run(["readelf", "-d", "-W", str(path)], capture_output=True, text=True,
                             check=True, timeout=30).stdout  # fmt: skip
    except FileNotFoundError:
        pytest.fail("readelf is missing: install binutils (setup.sh installs it with gcc)")
    needed = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert "libc.so.6" in needed
    assert not [n for n in needed if n.startswith(("libmpi", "libmpich"))], needed
    flags = [
        w for line in out.splitlines() if "Flags:" in line for w in line.split("Flags:")[1].split()
    ]
    assert "(BIND_NOW)" not in out and not {"NOW", "BIND_NOW"} & set(flags), out


@pytest.mark.parametrize("bind_now", [False, True], ids=["lazy", "bind-now"])
@pytest.mark.parametrize("argv", NO_MPI, ids=[" ".join(a) for a in NO_MPI])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_preloaded_into_a_process_without_mpi(
    built: Path, flavour: str, argv: list[str], bind_now: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_BIND_NOW")}
    env["LD_PRELOAD"] = str(LIB / f"librankpack_pmpi.{flavour}.so")
    if bind_now:
        env["LD_BIND_NOW"] = "1"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == ("ok\n" if "echo ok" in argv else "")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_binds_to_an_mpi_the_program_loaded_locally(
    built: Path, tmp_path: Path, flavour: str
) -> None:
    """A program without MPI dlopens (RTLD_LOCAL) a plugin that needs libmpi: the shim,
    preloaded, still measures both ranks."""
    env = {"LD_PRELOAD": str(LIB / f"librankpack_pmpi.{flavour}.so"),
           "RANKPACK_SHIM_DIR": str(tmp_path)}  # fmt: skip
    argv = [str(built / "dlopen_host"), str(built / flavour / "dlopen_plugin.so")]
    done = subprocess.run(mpirun(flavour, 2, env, argv), env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["rank 0 of 2 sum 1", "rank 1 of 2 sum 1"]
    records = read_records(tmp_path, 2)
    assert sorted(records) == [0, 1]
    for rec in records.values():
        assert rec.finalized and rec.world_size == 2
        assert {f.name: f.calls for f in rec.funcs}["MPI_Allreduce"] == 10


@pytest.mark.parametrize(("shim", "program"), [("openmpi", "mpich"), ("mpich", "openmpi")])
def test_an_mpi_of_the_other_family_is_refused_in_one_line(
    built: Path, shim: str, program: str
) -> None:
    """One rank, started without mpirun (a singleton): MPI_Init fails with the shim's line
    instead of the shim calling the library with the other ABI's handles."""
    env = {**os.environ, "LD_PRELOAD": str(LIB / f"librankpack_pmpi.{shim}.so")}
    done = subprocess.run([str(built / program / "imbalance"), "-n", "3"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert (
        f"rankpack shim ({shim}): the MPI loaded in this process is not of the {shim} ABI "
        'family; preload the shim built for the solver\'s MPI (docs/shim.md, "ABI families")'
    ) in done.stderr.splitlines()


def test_the_family_of_this_machines_programs(built: Path) -> None:
    assert family_of(listing_of(Path("/usr/bin/simpleFoam"))) == "openmpi"  # Debian's OpenFOAM
    for flavour in FLAVOURS:
        assert family_of(listing_of(built / flavour / "imbalance")) == flavour
    assert family_of(listing_of(Path("/bin/sh"))) is None


@pytest.mark.parametrize(
    ("program", "message"),
    [
        ("/nonexistent/simpleFoam", "cannot open shared object file"),
        ("/etc/passwd", "invalid ELF header"),
    ],
)
def test_a_program_the_loader_cannot_list_is_one_line(program: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        listing_of(Path(program))
    assert "\n" not in str(caught.value)


def test_a_missing_loader_is_one_line() -> None:
    with pytest.raises(UserError, match=r"cannot run the dynamic loader /nonexistent/ld\.so"):
        listing_of(Path("/bin/sh"), loader=Path("/nonexistent/ld.so"))


def test_the_loaders_output_is_read_bounded(tmp_path: Path) -> None:
    """A "loader" that never stops writing: the first MAX_LISTING_CHARS are kept, it is
    stopped."""
    loader = tmp_path / "ld.so"
    loader.write_text("#!/bin/sh\nprintf '\\tlibmpi.so.40 => /x (0x1)\\n'\nexec yes junk\n")
    loader.chmod(0o755)
    text = listing_of(Path("/bin/sh"), loader=loader)
    assert len(text) == mpiabi.MAX_LISTING_CHARS
    assert family_of(text) == "openmpi"


@pytest.mark.parametrize(
    "script",
    ["exec sleep 60", "exec >&- 2>&-; exec sleep 60"],
    ids=["silent", "closes-its-output"],
)
def test_a_loader_that_hangs_is_stopped_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    loader = tmp_path / "ld.so"
    loader.write_text(f"#!/bin/sh\n{script}\n")
    loader.chmod(0o755)
    monkeypatch.setattr(mpiabi, "LISTING_TIMEOUT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(UserError, match="did not finish in 1 s"):
        listing_of(Path("/bin/sh"), loader=loader)
    assert time.monotonic() - start < 10


def test_staging_tells_the_mpi_of_a_solver_from_its_libraries() -> None:
    """What staging records of a case's solver (`staging.detect_mpi`, on OpenFOAM's PATH):
    Debian's simpleFoam links Open MPI; a program linking no MPI is `NO_MPI`; a solver that
    is not there is not told (None), and the launch checks nothing."""
    from rankpack.case import staging

    assert staging.detect_mpi("simpleFoam") == "openmpi"
    assert staging.detect_mpi("true") == staging.NO_MPI
    assert staging.detect_mpi("noSuchFoam") is None
