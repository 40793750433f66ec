"""Entering a rank pod by its simulation's key (`starting.keyexec`, decision 0013): a real
``rankpack-rankd`` server on this machine's loopback, real processes."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.starting import keyexec

pytestmark = pytest.mark.integration

KEY = b"k" * 64


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stop = threading.Event()
    t = threading.Thread(target=keyexec.serve, args=(KEY, stop, port, "127.0.0.1"), daemon=True)
    t.start()
    yield "127.0.0.1", port
    stop.set()
    t.join(timeout=5)


def _run(address: tuple[str, int], command: str, key: bytes = KEY) -> tuple[int, bytes, bytes]:
    out, err = io.BytesIO(), io.BytesIO()
    code = keyexec.run_remote(address, key, command, out, err, connect_s=10)
    return code, out.getvalue(), err.getvalue()


def test_the_command_runs_with_its_output_and_exit_code(server: tuple[str, int]) -> None:
    code, out, err = _run(server, "echo one; echo two >&2; exit 3")
    assert (code, out, err) == (3, b"one\n", b"two\n")


def test_a_wrong_key_runs_nothing(server: tuple[str, int], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code, out, err = _run(server, f"touch {marker}", key=b"x" * 64)
    assert code == 255 and b"closed the connection" in err and out == b""
    time.sleep(0.3)
    assert not marker.exists()


def test_a_death_by_signal_is_128_plus_n(server: tuple[str, int]) -> None:
    assert _run(server, "kill -9 $$")[0] == 137


def test_a_caller_that_goes_away_takes_the_command_down(
    server: tuple[str, int], tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    conn = _connect(server)
    conn.sendall(b'{"key": "' + KEY + f'", "command": "echo $$ > {pid_file}; sleep 60"}}\n'
                 .encode())  # fmt: skip
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    conn.close()
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the command outlived its caller"
        time.sleep(0.05)


def _connect(address: tuple[str, int]) -> socket.socket:
    """A connection once the server listens (its thread may not have bound yet)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(address)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_nothing_listening_is_255_within_the_connect_time() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, err = io.BytesIO(), io.BytesIO()
    assert keyexec.run_remote(("127.0.0.1", port), KEY, "true", out, err, connect_s=0.5) == 255
    assert b"cannot reach" in err.getvalue()


def test_the_key_file_must_hold_a_key(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        keyexec.read_key(tmp_path / "key")
    assert keyexec.main([str(tmp_path / "missing")]) == 2
