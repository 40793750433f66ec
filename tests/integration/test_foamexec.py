"""Staging through a staging pod's sidecar (`foamexec.ExecTools`), real processes on this
machine's loopback: the tools directory as the pod's init container makes it
(``rankpack-stage --install-tools``), a real ``rankpack-rankd --loopback`` standing for the
sidecar in the Simulation's image (its own environment: OpenFOAM on its ``PATH``, its own
tutorials), and staging's Python with no OpenFOAM on its ``PATH`` at all: every tool, the
solver's ``PATH`` and libraries, and the tutorial are found and run on the sidecar's side,
bounded as they are here. About 10 s (two stagings of pitzDaily).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankpack.case import foamexec, foamtools, mpiabi, openfoam, sandbox, staging
from rankpack.case.staging import StageSpec
from rankpack.errors import UserError

pytestmark = pytest.mark.integration

PITZ = openfoam.EXAMPLES_ROOT / openfoam.KNOWN_TUTORIALS["pitzDaily"]
SIDE = "RANKPACK_TEST_SIDE"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sidecar's tutorials: pitzDaily with a file Debian's has not, and steps that say
    where they ran (the scanner off, as ``--case-scan off``)."""
    root = tmp_path_factory.mktemp("image-tutorials")
    case = root / "incompressible" / "simpleFoam" / "pitzDaily"
    shutil.copytree(PITZ, case)
    (case / "IMAGE-SIDE").write_text("from the image\n")
    (case / "Allrun").write_text(
        "#!/bin/sh\nrunApplication sh -c 'echo \"$RANKPACK_TEST_SIDE\" > side'\n"
        "runApplication blockMesh\nrunApplication $(getApplication)\n"
    )
    return root


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, image: Path) -> Iterator[foamexec.ExecTools]:
    tools = tmp_path_factory.mktemp("pod") / "tools"
    assert sandbox.main(["--install-tools", str(tools)], answer_to=tools.parent / "t") == 0
    key = (tools / foamexec.KEY_FILE).read_text()
    assert len(key) == 64 and int(key, 16) >= 0
    assert json.loads((tools / foamexec.HOSTS_FILE).read_text()) == {foamexec.HOST: "127.0.0.1"}
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**openfoam.foam_env(), SIDE: "sidecar", "RANKPACK_FOAM_EXAMPLES": str(image)}
    argv = [str(tools / foamexec.BINARY), "rankd", str(tools / foamexec.KEY_FILE), "--loopback",
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, env=env, cwd=tools.parent)
    assert proc.stderr is not None
    assert f"listening on 127.0.0.1:{port}".encode() in proc.stderr.readline()
    yield foamexec.ExecTools(tools, port=port)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


@pytest.fixture
def no_foam_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Staging's own process finds no OpenFOAM: what it runs, the sidecar runs."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(SIDE, raising=False)


def _stage(sidecar: foamexec.ExecTools, run_dir: Path, **kw: object) -> staging.StagedCase:
    run_dir.mkdir()
    spec = StageSpec("s1", "pitzDaily", 2, run_dir.parent, iterations=3, workdir=run_dir,
                     confined=True, scan=False, in_place=True, **kw)  # type: ignore[arg-type]  # fmt: skip
    with foamtools.using(sidecar):
        return staging.stage(spec)


@pytest.mark.usefixtures("no_foam_here")
def test_a_tutorial_of_the_image_is_staged_with_the_images_openfoam(
    sidecar: foamexec.ExecTools, tmp_path: Path
) -> None:
    assert shutil.which("blockMesh") is None and openfoam.HERE.which("simpleFoam") is None
    staged = _stage(sidecar, tmp_path / "run")
    run = staged.run_dir
    assert (run / "IMAGE-SIDE").read_text() == "from the image\n"  # the image's tutorial
    assert (run / "side").read_text() == "sidecar\n"  # its steps ran in the sidecar
    assert (run / "log.blockMesh").is_file() and (run / "constant/polyMesh/owner").is_file()
    assert sum(staged.cells_per_rank) == 12225 and len(staged.cells_per_rank) == 2
    assert (run / "processor1" / "constant" / "polyMesh" / "owner").is_file()
    assert staged.solver == "simpleFoam" and staged.mpi == "openmpi"  # the image's solver


@pytest.mark.usefixtures("no_foam_here")
def test_a_weighted_decomposition_is_computed_here_and_decomposed_there(
    sidecar: foamexec.ExecTools, tmp_path: Path
) -> None:
    staged = _stage(sidecar, tmp_path / "run", decompose="weighted", decompose_weights=(1.0, 3.0))
    small, large = staged.cells_per_rank
    assert small + large == 12225 and abs(large / small - 3.0) < 0.1


@pytest.mark.usefixtures("no_foam_here")
def test_what_the_image_lacks_or_refuses_is_a_one_line_error(
    sidecar: foamexec.ExecTools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = tmp_path / "case"
    case.mkdir()
    with foamtools.using(sidecar):
        assert sidecar.which("noSuchFoam") is None
        with pytest.raises(UserError, match="OpenFOAM tool noSuchFoam not found"):
            openfoam.run_tool(case, ["noSuchFoam"], "x")
        with pytest.raises(UserError, match="unknown tutorial 'noSuchTutorial'"):
            openfoam.find_tutorial("noSuchTutorial")
        monkeypatch.setattr(openfoam, "MAX_CASE_FILES", 10)
        with pytest.raises(UserError, match="holds more than 10 files"):
            openfoam.copy_case(openfoam.resolve_case("pitzDaily"), tmp_path / "run")
    # a tool that fails: its output (both streams) in its log, its fatal line said
    with foamtools.using(sidecar), pytest.raises(UserError, match="cannot find vertices"):
        openfoam.run_tool(case, ["sh", "-c", "echo '--> FOAM FATAL ERROR:'; echo 'cannot find "
                                 "vertices' >&2; exit 1"], "fails")  # fmt: skip
    assert "cannot find vertices" in (case / "log.fails").read_text()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_listing_in_the_image_is_bounded_in_time_and_size(
    sidecar: foamexec.ExecTools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's loader is given `mpiabi`'s bounds: one that never ends is stopped (and
    its process in the sidecar with it), one that never stops writing is cut."""
    pid_file = tmp_path / "pid"
    slow = tmp_path / "slow-ld.so"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nsleep 60\n")
    slow.chmod(0o755)
    monkeypatch.setattr(mpiabi, "LISTING_TIMEOUT_S", 1.0)
    monkeypatch.setattr(mpiabi, "this_loader", lambda: slow)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="did not finish in 1 s"):
        sidecar.listing("/bin/true")
    assert time.monotonic() - t0 < 10
    pid = int(pid_file.read_text())  # it ran, in the sidecar; and it is stopped there
    deadline = time.monotonic() + 15  # (the sidecar's SIGTERM, SIGKILL after 5 s)
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    chatty = tmp_path / "chatty-ld.so"
    chatty.write_text("#!/bin/sh\nexec yes libnothing.so.1\n")
    chatty.chmod(0o755)
    monkeypatch.setattr(mpiabi, "this_loader", lambda: chatty)
    assert len(sidecar.listing("/bin/true")) == mpiabi.MAX_LISTING_CHARS


def test_an_image_without_openfoams_tools_has_them_run_in_rankpacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MPI code's image (no blockMesh, no decomposePar; its solver on its ``PATH``):
    staging's tools run in rankpack's own OpenFOAM (`ExecTools.fallback`, staging's side),
    the solver is still found and listed in the image; with no fallback, a one-line error."""
    tools = tmp_path / "pod" / "tools"
    assert sandbox.main(["--install-tools", str(tools)], answer_to=tmp_path / "t") == 0
    bare = tmp_path / "image-bin"  # the image's PATH: a shell and the solver, nothing else
    bare.mkdir()
    for name in ("sh", "simpleFoam"):
        found = openfoam.HERE.which(name)
        assert found is not None
        (bare / name).symlink_to(found)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**openfoam.foam_env(), "PATH": str(bare)}
    argv = [str(tools / foamexec.BINARY), "rankd", str(tools / foamexec.KEY_FILE), "--loopback",
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, env=env, cwd=tools.parent)
    assert proc.stderr is not None
    assert f"listening on 127.0.0.1:{port}".encode() in proc.stderr.readline()
    case = tmp_path / "case"
    shutil.copytree(PITZ, case)  # no mesh: blockMesh must run
    try:
        image = foamexec.ExecTools(tools, port=port)
        assert image.which("blockMesh") is None and image.which("simpleFoam") is not None
        with foamtools.using(image), pytest.raises(UserError, match="blockMesh not found"):
            openfoam.run_tool(case, ["blockMesh"], "blockMesh")
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        spec = StageSpec("s1", str(case), 2, run_dir.parent, iterations=3, workdir=run_dir,
                         in_place=True)  # fmt: skip
        with foamtools.using(foamexec.ExecTools(tools, port=port, fallback=openfoam.HERE)):
            staged = staging.stage(spec)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    log = (run_dir / "log.blockMesh").read_text()
    assert log.startswith("rankpack: blockMesh is not in the Simulation's image")
    assert "End" in log and (run_dir / "processor1" / "constant" / "polyMesh").is_dir()
    assert sum(staged.cells_per_rank) == 12225
    assert staged.solver == "simpleFoam" and staged.mpi == "openmpi"  # listed in the image
