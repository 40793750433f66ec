"""Entering a rank pod with its simulation's key: ``rankpack-rankd`` and its client.

A launcher pod used to start the ranks through ``pods/exec``, a right that reaches every pod
of the namespace (the operator's too, where it shares the namespace). Instead (decision
0013) each rank pod of a launcher-pod simulation runs ``rankpack-rankd`` (`main`) as its
container's process: it listens on `PORT` and runs a command only for a caller who holds
the simulation's key, a random secret the operator puts in the simulation's owner
ConfigMap, which only that simulation's rank and launcher pods mount (`KEY_DIR`; no rank or
launcher identity may read ConfigMaps). So the launcher needs no ``pods/exec`` and reaches
no pod but its own simulation's: the MPI Operator's per-job SSH keys, without sshd.

The wire: the caller sends one line, ``{"key": K, "command": C}`` (at most `HEADER_MAX`
bytes); a wrong key closes the connection. C runs as ``/bin/sh -c C`` (Open MPI's orted
command is written for a remote shell, as with ssh or ``pods/exec``), in the container's
working directory and environment, stdin from /dev/null, in its own session. Its output
comes back in frames (a type byte ``o`` or ``e``, a 4-byte length, the bytes), then an
``x`` frame with its exit code (4 bytes, signed). A caller that goes away (mpirun ended)
takes the command's process group down (SIGTERM, SIGKILL after `KILL_AFTER_S`).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from rankpack.backend.kubernetes.objects.keyed import KEY_DIR, KEY_ITEM, PORT

HEADER_MAX = 64 << 10
KILL_AFTER_S = 5.0
_FRAME = struct.Struct(">cI")


def read_key(path: Path) -> bytes:
    """The key in ``path`` (stripped); OSError if it cannot be read, ValueError if empty."""
    key = path.read_bytes().strip()
    if not key:
        raise ValueError(f"the key file {path} is empty")
    return key


# -- the server (in the rank pod) ------------------------------------------------------------


def _send(conn: socket.socket, lock: threading.Lock, kind: bytes, data: bytes) -> None:
    with lock:
        conn.sendall(_FRAME.pack(kind, len(data)) + data)


def _read_line(conn: socket.socket, limit: int) -> bytes | None:
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk or len(buf) + len(chunk) > limit:
            return None
        buf += chunk
    return buf.split(b"\n", 1)[0]


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, 0.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s or None)


def session(conn: socket.socket, key: bytes, log: Callable[[str], None] = print) -> None:
    """One caller: its key checked, its command run, its output and exit code sent."""
    with conn:
        conn.settimeout(10.0)
        try:
            header = _read_line(conn, HEADER_MAX)
            request = json.loads(header) if header is not None else None
        except (OSError, ValueError):
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("command"), str):
            log("rankpack-rankd: a caller sent no request; closed")
            return
        given = str(request.get("key", "")).encode()
        if not hmac.compare_digest(given, key):
            log("rankpack-rankd: a caller without the simulation's key; closed")
            return
        conn.settimeout(None)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", request["command"]], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        lock = threading.Lock()

        def pump(stream: BinaryIO | None, kind: bytes) -> None:
            assert stream is not None
            with stream, contextlib.suppress(OSError):  # (the pipe closed once drained)
                while data := os.read(stream.fileno(), 65536):
                    _send(conn, lock, kind, data)

        def watch() -> None:  # the caller going away ends the command
            with contextlib.suppress(OSError):
                while conn.recv(4096):
                    pass
            _stop_group(proc)

        pumps = [threading.Thread(target=pump, args=(stream, kind), daemon=True)
                 for stream, kind in ((proc.stdout, b"o"), (proc.stderr, b"e"))]  # fmt: skip
        for t in pumps:
            t.start()
        threading.Thread(target=watch, daemon=True).start()
        code = proc.wait()
        code = 128 - code if code < 0 else code  # a death by signal N, as a shell says it
        for t in pumps:
            t.join(timeout=10.0)
        with contextlib.suppress(OSError):
            _send(conn, lock, b"x", struct.pack(">i", code))
            conn.shutdown(socket.SHUT_WR)


def serve(key: bytes, stop: threading.Event, port: int = PORT, host: str = "") -> None:
    """Accept callers until ``stop`` (each in its own thread)."""
    with socket.create_server((host, port), family=socket.AF_INET, backlog=128) as srv:
        srv.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=session, args=(conn, key), daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """``rankpack-rankd [KEY_FILE]``: a rank pod's process; ends at SIGTERM or SIGINT."""
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else KEY_DIR / KEY_ITEM
    try:
        key = read_key(path)
    except (OSError, ValueError) as exc:
        print(f"rankpack-rankd: cannot read the simulation's key: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(key, stop)
    return 0


# -- the client (the launcher's rsh agent) ---------------------------------------------------


def run_remote(
    address: tuple[str, int],
    key: bytes,
    command: str,
    out: BinaryIO,
    err: BinaryIO,
    connect_s: float = 120.0,
    abandoned: Callable[[], bool] = lambda: False,
) -> int:
    """Run ``command`` in the rank pod at ``address``: its output to ``out``/``err``, its
    exit code returned (255: the pod could not be reached, refused the key, or the
    connection was lost)."""
    deadline = time.monotonic() + connect_s
    while True:
        try:
            conn = socket.create_connection(address, timeout=5.0)
            break
        except OSError as exc:
            if time.monotonic() > deadline or abandoned():
                err.write(f"rankpack-exec: cannot reach {address[0]}:{address[1]}: {exc}\n"
                          .encode())  # fmt: skip
                return 255
            time.sleep(0.2)
    with conn:
        conn.settimeout(None)
        header = json.dumps({"key": key.decode(), "command": command}).encode() + b"\n"
        conn.sendall(header)
        reader = conn.makefile("rb")
        while True:
            head = reader.read(_FRAME.size)
            if len(head) < _FRAME.size:
                err.write(b"rankpack-exec: the rank pod closed the connection (a wrong key?)\n")
                return 255
            kind, size = _FRAME.unpack(head)
            data = reader.read(size)
            if kind == b"x":
                return int(struct.unpack(">i", data)[0])
            target = out if kind == b"o" else err
            target.write(data)
            target.flush()
