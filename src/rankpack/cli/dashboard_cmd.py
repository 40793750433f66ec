"""`rankpack dashboard`: a live page of a namespace's Simulations in the browser, served
on 127.0.0.1 from the user's own machine and read with the kubeconfig's own rights: nothing
is exposed by the operator, nothing port-forwarded to its pod.

`DashboardPoller` does ``rankpack top``'s round of reads (`rankpack.cli.top_cmd.read`) every
``--interval`` and keeps the history the page draws (`rankpack.report.dashboard`);
`DashboardServer` (the standard library's ThreadingHTTPServer, loopback only) serves the
page (package data: ``rankpack/report/page/``) and its data, ``api/view``, under a random
path printed with the URL: another user of this machine, or a web page the browser has
open (DNS rebinding), cannot guess it; a request whose Host is not this loopback address
is refused too. Each answer carries a strict Content-Security-Policy (the page's own script
and style only, fetches to itself only).
"""

from __future__ import annotations

import argparse
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from rankpack.cli.common import parse_seconds
from rankpack.cli.operator_cmd import _api_error, add_cluster_arguments, simulation_api
from rankpack.cli.run_cmd import stop_on_signals
from rankpack.cli.top_cmd import MAX_INTERVAL_S, MIN_INTERVAL_S, read
from rankpack.errors import UserError
from rankpack.report.dashboard import History
from rankpack.report.top import top_view

HOST = "127.0.0.1"
PAGE_REFRESH_S = 2.0
"""How often the page asks for ``api/view`` at most (every ``--interval`` if shorter)."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_FILES = {
    "": ("dashboard.html", "text/html; charset=utf-8"),
    "dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "icon.svg": ("icon.svg", "image/svg+xml"),
}
"""Path under the secret prefix -> (file in ``rankpack/report/page``, its type)."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dashboard",
        help="live page of a cluster's Simulations in the browser, on localhost (Kubernetes)",
        description=(
            "Serves a live page on 127.0.0.1 (this machine only; the URL it prints holds a "
            "random path) that reads a namespace's Simulations with the kubeconfig's own "
            "rights every --interval, as `rankpack top` does: the queue and the running "
            "Simulations; for each, its residuals over iterations, the per-rank duty heat "
            "map, requests against CPU use, recent resizes and wait-mode switches; and the "
            "co-location gain so far against running them one after another (how it is "
            "estimated is on the page and in docs/operator.md). What the credentials may "
            "not read is not shown. Ctrl-C stops it."
        ),
    )
    add_cluster_arguments(p)
    p.add_argument("--port", type=int, default=0, metavar="N",
                   help="port on 127.0.0.1 (default 0: any free one; the URL is "
                   "printed)")  # fmt: skip
    p.add_argument("--interval", type=parse_seconds, default=5.0, metavar="S",
                   help=f"seconds between reads of the cluster ({MIN_INTERVAL_S:g} to "
                   f"{MAX_INTERVAL_S:g}; default 5)")  # fmt: skip
    p.set_defaults(handler=handle_dashboard)


@dataclass
class DashboardPoller:
    """Reads the cluster every ``interval_s`` (`poll`) into a `History`; `body` is the
    page's data (JSON) of the last poll. ``api`` is the Simulation client
    (`rankpack.operator.simapi.SimulationApi`, the apiserver boundary)."""

    api: Any
    namespace: str
    interval_s: float
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.history = History()
        self.polled_s: float | None = None
        self.error: str | None = None
        self.lock = threading.Lock()
        self.body = b"{}"

    def first(self) -> None:
        """The first poll: Simulations that may not be listed are a `UserError` (exit 2)."""
        from rankpack.backend.kubernetes.api.kubeapi import ApiError

        try:
            found = read(self.api)
        except ApiError as exc:
            raise _api_error(exc, "cannot list Simulations") from None
        self._saw(self.clock(), found)

    def poll(self) -> None:
        """One round of reads. Refused (401, 403): nothing read before is shown any more;
        the apiserver away: the last view stays, marked with the error."""
        from rankpack.backend.kubernetes.api.kubeapi import ApiError

        now = self.clock()
        try:
            found = read(self.api)
        except ApiError as exc:
            if exc.status in (401, 403):
                self.history.forget()
            self.error = str(_api_error(exc, "cannot list Simulations"))
            self._publish(now)
            return
        self._saw(now, found)

    def _saw(self, now: float, found: tuple[list[Any], list[Any], list[Any] | None]) -> None:
        self.history.observe(now, top_view(*found))
        self.polled_s, self.error = now, None
        self._publish(now)

    def _publish(self, now: float) -> None:
        view = {
            "namespace": self.namespace,
            "intervalS": self.interval_s,
            "refreshS": min(PAGE_REFRESH_S, self.interval_s),
            "polledAt": self.polled_s,
            "now": now,
            "error": self.error,
            **self.history.view(now),
        }
        body = json.dumps(view, allow_nan=False, separators=(",", ":")).encode()
        with self.lock:
            self.body = body


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, poller: DashboardPoller, port: int, *, timeout_s: float = 10.0) -> None:
        self.poller = poller
        self.timeout_s = timeout_s
        self.token = secrets.token_urlsafe(18)
        page = resources.files("rankpack.report") / "page"
        self.files = {path: ((page / name).read_bytes(), kind)
                      for path, (name, kind) in PAGE_FILES.items()}  # fmt: skip
        super().__init__((HOST, port), _DashboardHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/{self.token}/"

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, args=(0.1,), name="dashboard-http",
                                  daemon=True)  # fmt: skip
        thread.start()
        return thread

    def answer(self, path: str, host: str | None) -> tuple[int, bytes, str]:
        """(status, body, content type) for a GET of ``path`` with Host ``host``."""
        if host not in (f"{HOST}:{self.port}", f"localhost:{self.port}"):
            return 403, b"this server answers on its loopback address only\n", "text/plain"
        prefix, _, rest = path.partition("?")[0].lstrip("/").partition("/")
        if not hmac.compare_digest(prefix.encode(), self.token.encode()):
            return 404, b"not found\n", "text/plain"
        if rest == "api/view":
            with self.poller.lock:
                return 200, self.poller.body, "application/json"
        if rest in self.files:
            body, kind = self.files[rest]
            return 200, body, kind
        return 404, b"not found\n", "text/plain"


class _DashboardHandler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.0"
    server_version = "rankpack-dashboard"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)  # a silent client is dropped

    def do_GET(self) -> None:
        self._send(*self.server.answer(self.path, self.headers.get("Host")))

    def do_HEAD(self) -> None:
        self.do_GET()

    def _refuse(self) -> None:
        self._send(405, b"GET only\n", "text/plain")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def _send(self, status: int, body: bytes, kind: str) -> None:
        try:
            self.send_response(status)
            for name, value in (
                ("Content-Type", kind), ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"), ("Content-Security-Policy", CSP),
                ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                ("X-Frame-Options", "DENY"), ("Cross-Origin-Resource-Policy", "same-origin"),
            ):  # fmt: skip
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client went away
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass  # the path holds the secret prefix: never logged


def handle_dashboard(args: argparse.Namespace) -> int:
    if not MIN_INTERVAL_S <= args.interval <= MAX_INTERVAL_S:
        raise UserError(f"--interval {args.interval:g} is out of range; give "
                        f"{MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds")  # fmt: skip
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be 0..65535 (0: any free port), got {args.port}")
    api = simulation_api(args)
    poller = DashboardPoller(api, str(api.namespace), args.interval)
    poller.first()
    try:
        server = DashboardServer(poller, args.port)
    except OSError as exc:
        raise UserError(f"cannot listen on {HOST}:{args.port}: {exc.strerror or exc}") from None
    with server, stop_on_signals() as stop:
        server.start()
        print(f"rankpack dashboard: {server.url} (Ctrl-C stops it)", flush=True)
        while not stop.wait(args.interval):
            poller.poll()
        server.shutdown()
    return 0
