"""FakeApiserver: the one HTTP apiserver fake of the tests, a real server on 127.0.0.1 for the
tests that need the real client (`ClientKubeApi`, its informer) or a process (the node agent).

The boundary is the HTTP stream: nothing of the client is replaced. Every request is recorded
(`seen`: method, path, query, body, content type, Authorization) and answered by the next
scripted answer (`script`), else by ``answer`` (a function of the request), else by ``api``
(the in-memory apiserver fake, `tests.fakeapi.FakeKubeApi`, through its `request`, which
also checks the bearer token it was given). An answer is ``("list", obj)`` (200 JSON),
``("json", code, obj)``, ``("status", code, Status)``, ``("watch", [events])`` (a 200 stream
of JSON lines, then closed) or ``("cut", [events])`` (a stream broken off without its end:
the apiserver going away).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from tests.fakeapi import FakeKubeApi

Answer = tuple[Any, ...]


@dataclass(frozen=True)
class Seen:
    """One request as the fake apiserver received it."""

    method: str
    target: str
    """The path with its query string, as sent."""
    body: Any
    content_type: str | None
    auth: str | None

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.target).query))


class FakeApiserver(ThreadingHTTPServer):
    """See the module doc. ``start`` serves it on a thread; ``kubeconfig`` points a client
    at it; ``stop`` ends it."""

    daemon_threads = True

    def __init__(
        self,
        api: FakeKubeApi | None = None,
        answer: Callable[[Seen], Answer] | None = None,
        port: int = 0,
    ) -> None:
        self.api = api
        self.answer = answer
        self.script: deque[Answer] = deque()
        self.seen: list[Seen] = []
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> FakeApiserver:
        threading.Thread(target=self.serve_forever, args=(0.1,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def kubeconfig(self, path: Path, token: str = "t", namespace: str = "rankpack") -> Path:
        """A kubeconfig at ``path`` for this server, a bearer ``token`` and ``namespace``."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u",
                                                   "namespace": namespace}}],
        }))  # fmt: skip
        return path

    def respond(self, seen: Seen) -> Answer:
        """The answer to one request (see the module doc)."""
        self.seen.append(seen)
        if self.script:
            return self.script.popleft()
        if self.answer is not None:
            return self.answer(seen)
        if self.api is None:
            return ("status", 500, {"message": "no script"})
        if self.api.token and seen.auth != f"Bearer {self.api.token}":
            return ("status", 401, {"reason": "Unauthorized", "message": "Unauthorized"})
        try:
            out = self.api.request(seen.method, seen.path, query=seen.query, body=seen.body)
        except ApiError as e:
            return ("status", e.status, {"reason": e.reason, "message": e.message})
        return ("json", 201 if seen.method == "POST" else 200, out)


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiserver

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        seen = Seen(self.command, self.path, body, self.headers.get("Content-Type"),
                    self.headers.get("Authorization"))  # fmt: skip
        answer = self.server.respond(seen)
        kind = answer[0]
        if kind == "list":
            self._json(200, answer[1])
        elif kind == "json":
            self._json(answer[1], answer[2])
        elif kind == "status":
            self._json(answer[1], {"kind": "Status", "code": answer[1], **answer[2]})
        else:
            self._stream(answer[1], cut=kind == "cut")

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def _stream(self, events: list[Any], cut: bool) -> None:
        lines = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(f"{len(lines):x}\r\n".encode() + lines + b"\r\n")
        if not cut:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True  # "cut": no last chunk, the connection just ends

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass
