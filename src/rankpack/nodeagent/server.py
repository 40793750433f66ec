"""The node agent's HTTP server: the standard library's ThreadingHTTPServer around
`service.NodeAgent`.

Bounded against a slow or hostile client: a request body larger than `service.MAX_BODY` is
refused (413) without being read, a body needs its Content-Length (411), a connection that
sends nothing for ``timeout_s`` is closed, at most ``max_busy`` requests are answered at
once (503 beyond), and the standard library caps request and header lines. Requests are
logged at debug level without their headers (tokens are never logged).
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rankpack.nodeagent.service import MAX_BODY, NodeAgent, Response

log = logging.getLogger("rankpack.nodeagent")


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        agent: NodeAgent,
        *,
        timeout_s: float = 10.0,
        max_busy: int = 32,
    ) -> None:
        self.agent = agent
        self.timeout_s = timeout_s
        self.busy = threading.BoundedSemaphore(max_busy)
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (tests, and the command's main thread waits)."""
        thread = threading.Thread(target=self.serve_forever, args=(0.1,), name="node-agent-http",
                                  daemon=True)  # fmt: skip
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.0"
    server_version = "rankpack-node-agent"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)  # a silent client is dropped

    def do_GET(self) -> None:
        self._answer("GET")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def do_PATCH(self) -> None:
        self._answer("PATCH")

    def _answer(self, method: str) -> None:
        if not self.server.busy.acquire(blocking=False):
            self._send(Response.error(503, "busy; try again"))
            return
        response: Response | None
        try:
            body, refused = self._body(method)
            response = refused or self.server.agent.handle(
                method, self.path, self.headers.get("Authorization"), body
            )
        except OSError:  # the client was too slow to send its body, or went away
            self.close_connection = True
            response = None
        except Exception:  # a bug must not take the agent down: answer 500, log it
            log.exception("%s %s failed", method, self.path[:200])
            response = Response.error(500, "internal error")
        finally:
            self.server.busy.release()
        if response is not None:
            self._send(response)

    def _body(self, method: str) -> tuple[bytes | None, Response | None]:
        length_text = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            return None, Response.error(411, "send a Content-Length, not a chunked body")
        if length_text is None:
            if method in ("PUT", "POST", "PATCH"):
                return None, Response.error(411, "a body needs a Content-Length")
            return None, None
        try:
            length = int(length_text)
        except ValueError:
            return None, Response.error(400, "Content-Length is not a number")
        if length < 0:
            return None, Response.error(400, "Content-Length is negative")
        if length > MAX_BODY:
            self.close_connection = True
            return None, Response.error(413, f"the body is larger than {MAX_BODY} bytes")
        return self.rfile.read(length), None

    def _send(self, response: Response) -> None:
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
        except OSError:  # the client went away
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)
