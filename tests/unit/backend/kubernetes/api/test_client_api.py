"""ClientKubeApi over HTTP against the HTTP apiserver fake
(`tests.fakeapiserver`) answering canned replies: the official
client's wiring (paths, verbs, content types, the bearer token, error statuses)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import load_config
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Conflict, Gone, NotFound
from tests.fakeapiserver import Answer, FakeApiserver, Seen

pytestmark = pytest.mark.timeout(30)


def canned(seen: Seen) -> Answer:
    """A watch: one event, then 410 Gone; a name with ``forbidden``: 403 (a resize the node
    has no room for); ``missing``: 404; anything else: one pod."""
    if "watch=true" in seen.target:
        return ("watch", [
            {"type": "ADDED", "object": {"metadata": {"name": "a"}}},
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                         "message": "too old"}},
        ])  # fmt: skip
    if "forbidden" in seen.target:
        why = "node didn't have enough allocatable resources"
        return ("status", 403, {"reason": "Forbidden", "message": why})
    if "missing" in seen.target:
        return ("status", 404, {"reason": "NotFound", "message": "not found"})
    return ("json", 200, {"items": [{"metadata": {"name": "p"}}], "metadata": {"uid": "u"}})


@pytest.fixture(autouse=True)
def _canned(server: FakeApiserver) -> None:
    server.answer = canned


def kubeconfig_at(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: sekrit}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u, namespace: rankpack}}]\n"
    )
    return path


def test_requests_as_the_api_spells_them(tmp_path: Path, server: FakeApiserver) -> None:
    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, server.url)))
    assert api.list_pods("a=b,c") == [{"metadata": {"name": "p"}}]
    api.create("pods", {"metadata": {"name": "p"}})
    api.patch_resize("p", {"spec": {"containers": []}})
    api.delete("configmaps", "rankpack-s1", "Foreground")
    api.list_pods_all_namespaces("status.phase!=Failed")
    seen = [(s.method, s.target) for s in server.seen]
    assert seen == [
        ("GET", "/api/v1/namespaces/rankpack/pods?labelSelector=a%3Db%2Cc"),
        ("POST", "/api/v1/namespaces/rankpack/pods"),
        ("PATCH", "/api/v1/namespaces/rankpack/pods/p/resize"),
        ("DELETE", "/api/v1/namespaces/rankpack/configmaps/rankpack-s1"),
        ("GET", "/api/v1/pods?fieldSelector=status.phase%21%3DFailed"),
    ]
    assert {s.auth for s in server.seen} == {"Bearer sekrit"}
    assert server.seen[2].content_type == "application/strategic-merge-patch+json"
    assert server.seen[3].body["propagationPolicy"] == "Foreground"


def test_the_new_calls_for_the_node_agents(tmp_path: Path, server: FakeApiserver) -> None:
    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, server.url)))
    api.list_pods_all_namespaces("spec.nodeName=n1", "app=x,rankpack.dev/rank")
    api.list_pods_in("agents", "app.kubernetes.io/name=rankpack-node-agent")
    assert [s.target for s in server.seen] == [
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&labelSelector=app%3Dx%2Crankpack.dev/rank",
        "/api/v1/namespaces/agents/pods?labelSelector=app.kubernetes.io/name%3Drankpack-node-agent",
    ]
    assert api.bearer_token() == "sekrit"
    configuration = api.api_client.configuration
    configuration.refresh_api_key_hook = None  # (the kubeconfig's hook sets its token again)
    configuration.api_key = {"BearerToken": "bearer rotated"}  # as the in-cluster loader sets it
    assert api.bearer_token() == "rotated"
    configuration.api_key = {}  # a client certificate: no token to show
    assert api.bearer_token() is None


def test_error_statuses_become_kube_errors(tmp_path: Path, server: FakeApiserver) -> None:
    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, server.url)))
    with pytest.raises(ApiError) as info:
        api.patch_resize("forbidden", {})
    assert (info.value.status, info.value.reason) == (403, "Forbidden")
    assert "allocatable" in info.value.message
    with pytest.raises(NotFound) as found:
        api.get("pods", "missing")
    assert found.value.not_found and isinstance(found.value, ApiError)


def test_errors_are_typed_by_status() -> None:
    assert type(ApiError(404, "NotFound", "x")) is NotFound
    assert type(ApiError(409, "Conflict", "x")) is Conflict
    assert type(ApiError(410, "Gone", "x")) is Gone
    assert type(ApiError(500, "InternalError", "x")) is ApiError
    assert ApiError(0, "Unreachable", "x").transient


def test_a_watch_yields_events_and_raises_gone(tmp_path: Path, server: FakeApiserver) -> None:
    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, server.url)))
    seen = []
    with pytest.raises(Gone):
        for event in api.watch("/apis/rankpack.dev/v1/namespaces/ns/simulations", timeout_s=5):
            seen.append(event["object"]["metadata"]["name"])
    assert seen == ["a"]
    assert "timeoutSeconds=5" in server.seen[-1].target


def test_an_unreachable_apiserver_is_a_clear_error(tmp_path: Path) -> None:
    from rankpack.backend.kubernetes.connect import connect
    from rankpack.backend.protocol import BackendError

    config = load_config(kubeconfig_at(tmp_path, "http://127.0.0.1:9"))
    with pytest.raises(BackendError, match="unreachable"):
        connect(config)


def test_an_exec_that_cannot_start_is_tried_again_then_given_up(tmp_path: Path) -> None:
    # A launch that meets an apiserver restart: the rsh agent's exec is connected again
    # while nothing answers (nothing ran yet), for as long as it is told, then fails.
    import time

    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, "http://127.0.0.1:9")))
    t0 = time.monotonic()
    with pytest.raises(ApiError) as err:
        api.exec_attached("p", "rank", ["true"], connect_retry_s=2.0)
    waited = time.monotonic() - t0
    tries = sum(n for (verb, res, _), n in api.requests.counts().items() if res == "pods/exec")
    assert err.value.status == 0 and err.value.transient
    assert tries >= 2 and 1.0 <= waited <= 10.0, (tries, waited)


def test_an_exec_refused_is_not_tried_again(tmp_path: Path, server: FakeApiserver) -> None:
    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, server.url)))
    with pytest.raises(ApiError) as err:
        api.exec_attached("forbidden", "rank", ["true"], connect_retry_s=30.0)
    tries = sum(n for (verb, res, _), n in api.requests.counts().items() if res == "pods/exec")
    assert err.value.status == 403 and tries == 1, (err.value, tries)


def test_an_exec_refused_right_after_the_apiserver_came_back_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restarted apiserver refuses (403) until its authorizer has synced: after it was
    # away, a refusal is tried again for a while (RESTART_REFUSALS_S), then given up.
    import socket
    import time

    from rankpack.backend.kubernetes.api import client as api_module

    monkeypatch.setattr(api_module, "RESTART_REFUSALS_S", 2.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started: list[FakeApiserver] = []

    def come_back() -> None:
        time.sleep(1.0)  # away for a second: connection refused meanwhile
        httpd = FakeApiserver(answer=canned, port=port)
        started.append(httpd)
        httpd.serve_forever()

    threading.Thread(target=come_back, daemon=True).start()
    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, f"http://127.0.0.1:{port}")))
    try:
        with pytest.raises(ApiError) as err:
            api.exec_attached("forbidden", "rank", ["true"], connect_retry_s=30.0)
    finally:
        for httpd in started:
            httpd.stop()
    refused = [r for httpd in started for r in httpd.seen if "/exec" in r.target]
    assert err.value.status == 403
    assert len(refused) >= 2, refused  # refused, tried again, refused: then given up


def test_an_exec_nobody_waits_for_is_not_tried_again(tmp_path: Path) -> None:
    # The rsh agent's mpirun died while the apiserver was away: the agent stops retrying
    # (it would otherwise start a daemon no mpirun waits for, or linger for minutes).
    import time

    api = ClientKubeApi(load_config(kubeconfig_at(tmp_path, "http://127.0.0.1:9")))
    checks: list[float] = []

    def abandoned() -> bool:
        checks.append(time.monotonic())
        return len(checks) >= 2  # wanted for the first try only

    t0 = time.monotonic()
    with pytest.raises(ApiError) as err:
        api.exec_attached("p", "rank", ["true"], connect_retry_s=60.0, abandoned=abandoned)
    tries = sum(n for (verb, res, _), n in api.requests.counts().items() if res == "pods/exec")
    assert err.value.reason == "Abandoned" and tries == 1, (err.value, tries)
    assert time.monotonic() - t0 < 5.0
