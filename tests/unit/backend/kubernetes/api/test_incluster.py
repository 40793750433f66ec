"""`InClusterPods` against a real HTTPS server on loopback (the dev cluster's PKI: a CA and
a serving certificate for 127.0.0.1), as the launcher's init container calls it."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from rankpack.backend.kubernetes.api.incluster import InClusterPods
from rankpack.backend.kubernetes.api.kubeapi import ApiError, NotFound
from rankpack.backend.protocol import BackendError
from rankpack.devcluster import pki


class Apiserver(ThreadingHTTPServer):
    answer: tuple[int, bytes] = (200, b"")
    seen: list[tuple[str, str, dict[str, list[str]]]]


class Handler(BaseHTTPRequestHandler):
    server: Apiserver

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self.server.seen.append((url.path, self.headers["Authorization"], parse_qs(url.query)))
        status, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.generate(d, [])
    return d


@pytest.fixture
def api(certs: Path, tmp_path: Path) -> Iterator[tuple[Apiserver, Path, dict[str, str]]]:
    server = Apiserver(("127.0.0.1", 0), Handler)
    server.seen = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certs / "apiserver.crt", certs / "apiserver.key")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("tok-1\n")
    (account / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(server.server_address[1])}  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, account, env
    server.shutdown()
    server.server_close()


def test_lists_the_namespaces_pods_by_label_with_the_current_token(api: Any) -> None:
    server, account, env = api
    pods = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    server.answer = (200, json.dumps({"kind": "PodList", "items": pods}).encode())
    lister = InClusterPods("team-a", environ=env, account_dir=account)
    assert lister.list_pods("rankpack.dev/sim=s1") == pods
    (account / "token").write_text("tok-2")  # rotated: read again for each call
    assert lister.list_pods("x=y") == pods
    path = "/api/v1/namespaces/team-a/pods"
    assert server.seen == [
        (path, "Bearer tok-1", {"labelSelector": ["rankpack.dev/sim=s1"]}),
        (path, "Bearer tok-2", {"labelSelector": ["x=y"]}),
    ]


def test_an_error_status_is_the_api_error_that_names_it(api: Any) -> None:
    server, account, env = api
    status = {"kind": "Status", "reason": "Forbidden", "message": "pods is forbidden"}
    server.answer = (403, json.dumps(status).encode())
    lister = InClusterPods("ns", environ=env, account_dir=account)
    with pytest.raises(ApiError) as err:
        lister.list_pods("a=b")
    assert (err.value.status, err.value.reason, err.value.transient) == (403, "Forbidden", False)
    server.answer = (404, b"not json")
    with pytest.raises(NotFound, match="not json"):
        lister.list_pods("a=b")
    server.answer = (200, b"[1, 2]")
    with pytest.raises(ApiError, match="not a pod list"):
        lister.list_pods("a=b")


def test_an_apiserver_it_cannot_reach_or_trust_is_transient(api: Any, tmp_path: Path) -> None:
    server, account, env = api
    other = tmp_path / "other"
    other.mkdir()
    pki.generate(other, [])  # another CA: the server's certificate is not trusted
    (account / "ca.crt").write_bytes((other / "ca.crt").read_bytes())
    with pytest.raises(ApiError) as err:
        InClusterPods("ns", environ=env, account_dir=account).list_pods("a=b")
    assert err.value.status == 0 and err.value.transient and server.seen == []
    closed = {**env, "KUBERNETES_SERVICE_PORT": "1"}
    with pytest.raises(ApiError) as err:
        InClusterPods("ns", environ=closed, account_dir=account).list_pods("a=b")
    assert err.value.transient


def test_outside_a_pod_it_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="KUBERNETES_SERVICE_HOST"):
        InClusterPods("ns", environ={}, account_dir=tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(BackendError, match="no ServiceAccount token and CA in"):
        InClusterPods("ns", environ=env, account_dir=tmp_path)
