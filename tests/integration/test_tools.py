"""``rankpack-tools`` (``tools/``, static Go): what runs inside a Simulation's own image.

Its Go tests (``go test ./...``: the key exchange, the launch marker, the exit file, signals),
then the built binary as the pods run it, real processes on this machine's loopback:
``rankpack-rankd`` entered by ``rankpack-exec`` with the key and the hosts file (decision
0013), ``rankpack-launch`` holding the launch marker that the operator's Python reads
(`exitwrapper.state`) and writing the exit file it reads (`exitwrapper.read_exit`), and
`tools.install` on a case whose ranks put links at the tools' names.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.objects import keyed
from rankpack.backend.kubernetes.starting import exitwrapper, tools
from rankpack.devcluster import toolsbuild

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KEY = "k" * 64


def test_the_go_tests_pass() -> None:
    out = toolsbuild.go_command(REPO, ["test", "-count=1", "./..."], timeout_s=300)
    assert "ok  \trankpack.dev/tools/keyexec" in out and "ok  \trankpack.dev/tools/launch" in out


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tools as the operator installs them on a case volume (`tools.install`)."""
    case = tmp_path_factory.mktemp("case")
    return tools.install(case)


def test_the_binary_is_static_and_installed_under_each_name(bin_dir: Path) -> None:
    binary = bin_dir / tools.BINARY
    head = binary.read_bytes()[:4]
    assert head == b"\x7fELF" and os.access(binary, os.X_OK)
    headers = subprocess.run(["readelf", "-l", str(binary)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert "INTERP" not in headers and "DYNAMIC" not in headers  # no loader, no libc
    for name in keyed.TOOL_NAMES:
        assert os.readlink(bin_dir / name) == tools.BINARY


def test_install_replaces_what_a_rank_put_at_the_tools_names(tmp_path: Path) -> None:
    case = tmp_path / "case"
    d = case / keyed.TOOLS_DIR
    d.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("s")
    (d / tools.BINARY).symlink_to(secret)  # written through, it would overwrite this
    (d / keyed.RANKD).mkdir()
    (d / keyed.AGENT).write_text("#!/bin/sh\necho evil\n")
    tools.install(case)
    assert secret.read_text() == "s"
    assert not (d / tools.BINARY).is_symlink() and (d / tools.BINARY).stat().st_size > 1 << 20
    for name in keyed.TOOL_NAMES:
        assert os.readlink(d / name) == tools.BINARY


@pytest.fixture
def rankd(bin_dir: Path, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    proc = subprocess.Popen([str(bin_dir / keyed.RANKD), str(key), "--port", str(port)],
                            stderr=subprocess.PIPE, cwd=tmp_path)  # fmt: skip
    assert proc.stderr is not None
    assert b"listening" in proc.stderr.readline()
    yield port, tmp_path
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0  # it ends at SIGTERM


def _exec(bin_dir: Path, port: int, work: Path, command: list[str], key: str = KEY,
          host: str = "rankpack-s1-g0") -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    (work / "agent-key").write_text(key)
    (work / "hosts.json").write_text(json.dumps({"rankpack-s1-g0": "127.0.0.1"}))
    env = {"PATH": "/usr/bin:/bin", keyed.KEY_ENV: str(work / "agent-key"),
           keyed.HOSTS_ENV: str(work / "hosts.json")}  # fmt: skip
    # (the port: the test's own; in the pods it is keyed.PORT, the agent's default)
    argv = [str(bin_dir / keyed.AGENT), host, *command]
    return subprocess.run(argv, env={**env, "RANKPACK_RANKD_PORT": str(port)},
                          capture_output=True, timeout=60, check=False)  # fmt: skip


def test_a_rank_pod_is_entered_with_the_key_its_output_and_code_come_back(
    bin_dir: Path, rankd: tuple[int, Path]
) -> None:
    port, work = rankd
    # Open MPI hands the agent its orted command as words for a remote shell
    done = _exec(bin_dir, port, work, ["echo", "out;", "echo", "err", ">&2;", "exit", "7"])
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    mark = work / "ran"
    refused = _exec(bin_dir, port, work, ["touch", str(mark)], key="wrong")
    assert refused.returncode == 255 and b"closed the connection" in refused.stderr
    assert not mark.exists()
    unknown = _exec(bin_dir, port, work, ["true"], host="rankpack-other-g0")
    assert unknown.returncode == 255 and b"no address or key" in unknown.stderr


def test_launch_holds_the_marker_the_operator_reads_and_writes_the_exit_file(
    bin_dir: Path, tmp_path: Path
) -> None:
    case = tmp_path / "case"
    rd = case / ".rankpack"
    rd.mkdir(parents=True)
    image_bin = tmp_path / "image-bin"  # the image's PATH: its own mpirun
    image_bin.mkdir()
    (image_bin / "mpirun").write_text('#!/bin/sh\necho "mpirun $*"\nexec /bin/sleep 1.5\n')
    (image_bin / "mpirun").chmod(0o755)
    spec = {"version": 1, "mpirun": ["mpirun.openmpi", "mpirun"], "args": ["-np", "2", "solver"],
            "cwd": str(case), "env": {}, "log": str(case / "log.solver"),
            "exit": str(rd / exitwrapper.EXIT),
            "termination_log": str(tmp_path / "term")}  # fmt: skip
    (tmp_path / "launch.json").write_text(json.dumps(spec))
    argv = [str(bin_dir / keyed.LAUNCH), str(tmp_path / "launch.json")]
    proc = subprocess.Popen(argv, env={"PATH": str(image_bin)})
    deadline = time.monotonic() + 10
    while exitwrapper.state(rd) != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exitwrapper.state(rd) == "running"  # the operator's reading of Go's marker
    assert proc.wait(timeout=30) == 0
    assert exitwrapper.read_exit(rd / exitwrapper.EXIT) == 0 and exitwrapper.state(rd) == "ended"
    assert (case / "log.solver").read_text() == "mpirun -np 2 solver\n"
    # again (a launcher pod recreated): the exit file answers, mpirun never runs twice
    assert subprocess.run(argv, env={"PATH": str(image_bin)}, timeout=30).returncode == 0
    assert (case / "log.solver").read_text() == "mpirun -np 2 solver\n"


def test_launch_without_mpirun_in_the_image_says_so_in_its_termination_message(
    bin_dir: Path, tmp_path: Path
) -> None:
    case = tmp_path / "case"
    (case / ".rankpack").mkdir(parents=True)
    spec = {"version": 1, "mpirun": ["mpirun.mpich", "mpiexec"], "args": [], "cwd": str(case),
            "env": {}, "log": str(case / "log"), "exit": str(case / ".rankpack/mpirun.exit"),
            "termination_log": str(tmp_path / "term")}  # fmt: skip
    (tmp_path / "launch.json").write_text(json.dumps(spec))
    done = subprocess.run([str(bin_dir / keyed.LAUNCH), str(tmp_path / "launch.json")],
                          env={"PATH": str(tmp_path)}, capture_output=True, timeout=30)  # fmt: skip
    assert done.returncode == 2
    message = (tmp_path / "term").read_text()
    assert message.startswith("no mpirun.mpich or mpiexec in this image"), message
    assert exitwrapper.state(case / ".rankpack") == "never"
