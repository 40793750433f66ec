"""Where staging's OpenFOAM runs (`foamtools`, `foamexec`): chosen by `using` alone, and what
is sent to the sidecar is an argv whose words stay words; what it answers is read strictly.
The sidecar itself (a real ``rankpack-rankd``) is tests/integration/test_foamexec.py."""

from __future__ import annotations

import threading
from pathlib import Path, PurePosixPath

import pytest

from rankpack.case import foamexec, foamtools, openfoam
from rankpack.errors import UserError

TOOLS = Path("/rankpack/tools")


def test_this_processs_openfoam_unless_a_sandbox_says_otherwise() -> None:
    assert foamtools.current() is None and openfoam.tools() is openfoam.HERE
    exec_tools = foamexec.ExecTools(TOOLS)
    seen: list[object] = []
    with foamtools.using(exec_tools):
        assert openfoam.tools() is exec_tools
        thread = threading.Thread(target=lambda: seen.append(openfoam.tools()))
        thread.start()
        thread.join()
    assert seen == [openfoam.HERE]  # another thread (a local staging worker) keeps its own
    assert openfoam.tools() is openfoam.HERE


@pytest.mark.parametrize(
    ("argv", "cwd", "sent"),
    [
        (["blockMesh"], Path("/runs/r1"),
         ["--argv", "--dir", "/runs/r1", "openfoam", "blockMesh"]),
        (["sh", "-c", "touch x; rm -rf $HOME", "a b"], None,
         ["--argv", "openfoam", "sh", "-c", "touch x; rm -rf $HOME", "a b"]),
    ],
)  # fmt: skip
def test_a_command_is_sent_as_an_argv_never_a_shell_line(
    argv: list[str], cwd: Path | None, sent: list[str]
) -> None:
    exec_tools = foamexec.ExecTools(TOOLS, port=9)
    assert exec_tools._exec(argv, cwd) == [str(TOOLS / "rankpack-tools"), "exec", *sent]
    env = exec_tools._env()
    assert env == {"PATH": "/usr/bin:/bin", "RANKPACK_RANKD_KEY": "/rankpack/tools/key",
                   "RANKPACK_RANKD_HOSTS": "/rankpack/tools/hosts.json",
                   "RANKPACK_RANKD_PORT": "9"}  # fmt: skip


@pytest.mark.parametrize("said", ["../../etc", "/etc/x", "", 7, "a/../../b", "x" * 1001])
def test_a_tutorial_the_image_names_out_of_shape_is_refused(said: object) -> None:
    with pytest.raises(UserError, match="out of shape"):
        foamexec._relative(said)
    assert foamexec._relative("incompressible/simpleFoam/pitzDaily") == PurePosixPath(
        "incompressible/simpleFoam/pitzDaily"
    )


def test_a_failed_call_is_one_line_from_its_last_line_or_its_status() -> None:
    assert foamexec._failed("copying x", 2, "noise\ncase 'x': y is a FIFO\n") == (
        "copying x failed (case 'x': y is a FIFO)"
    )
    assert foamexec._failed("copying x", 255, "") == "copying x failed (status 255)"
    assert foamexec._failed("copying x", None, "partial") == "copying x did not finish in time"
    assert foamexec._json('rankpack-exec: noise\n{"bytes": 3}\n') == {"bytes": 3}
    assert foamexec._json("{not json") is None and foamexec._json("") is None
