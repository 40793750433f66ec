"""`ClientKubeApi`: `kubeapi.KubeApi` through the official ``kubernetes`` client.

The only code (with `config`) that imports the client. Objects are read as raw JSON rather
than through the client's generated models: the models of a client older than the server
drop fields the backend needs (the resize conditions, ``status.observedGeneration``,
``containerStatuses[].resources``). Made by `connect` for the backend and the operator, by
the node agent's command and by the dev cluster.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import urllib3
import yaml  # type: ignore[import-untyped]  # (PyYAML, a dependency of kubernetes)

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import (
    ApiError,
    ExecResult,
    Obj,
    RequestCounter,
    error_from,
    request_labels,
)
from rankpack.backend.protocol import BackendError

NETWORK_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
"""What a request that got no answer raises (refused, reset, TLS, timeouts)."""
POOL_SIZE = 32
"""Connections kept to the apiserver (the client's default is 5 per CPU)."""
CONFIG_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, TypeError, KeyError,
                                              yaml.YAMLError)  # fmt: skip
"""What loading a kubeconfig raises besides the client's own ``ConfigException`` (a file that
cannot be read, YAML or fields that do not parse)."""


_PATHS = {"pods": "pods", "services": "services", "configmaps": "configmaps", "events": "events",
          "resourcequotas": "resourcequotas", "limitranges": "limitranges"}  # fmt: skip


class ClientKubeApi:
    """`KubeApi` through the official ``kubernetes`` client."""

    def __init__(self, config: KubernetesConfig, *, request_timeout_s: float = 30.0) -> None:
        from kubernetes import client
        from kubernetes import config as kconfig
        from kubernetes.config import ConfigException

        load_errors: tuple[type[Exception], ...] = (ConfigException, *CONFIG_ERRORS)
        configuration = client.Configuration()
        # each watched collection holds a connection for minutes (`informer`): room for
        # them beside the REST calls, so that none is opened and thrown away per call
        configuration.connection_pool_maxsize = POOL_SIZE
        try:
            if config.kubeconfig is None:
                kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                self.api_client = client.ApiClient(configuration)
            else:
                self.api_client = kconfig.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=str(config.kubeconfig),
                    context=config.context,
                    client_configuration=configuration,
                )
        except load_errors as exc:
            raise BackendError(f"cannot load the Kubernetes configuration: {exc}") from exc
        self.core = client.CoreV1Api(self.api_client)
        self.namespace = config.namespace
        self.timeout_s = request_timeout_s
        self.host = str(self.api_client.configuration.host)
        self.requests = RequestCounter()

    # -- plumbing --------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One REST call (``path`` as the API spells it, e.g. ``/apis/rankpack.dev/v1/...``),
        JSON in and out; an error status raises the `ApiError` that names it."""
        response = self._send(method, path, query, body, content_type, self.timeout_s)
        data = response.read()
        if not 200 <= int(response.status) < 300:
            raise error_from(int(response.status), str(response.reason or ""), data)
        if not data:
            return {}
        result: Obj = json.loads(data)
        return result

    def list_collection(self, path: str, query: Mapping[str, str] | None = None) -> Obj:
        return self.request("GET", path, query=query)

    def watch(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> Iterator[Obj]:
        """The events (``{"type": ..., "object": ...}``) of a watch on the collection at
        ``path``, until the apiserver ends it after ``timeout_s``. The watch is open when
        this returns (a refusal or an unreachable apiserver raises here). An ``ERROR``
        event raises its `ApiError` (`Gone`: the resourceVersion is too old, list again)."""
        q = {**(query or {}), "watch": "true", "timeoutSeconds": str(int(timeout_s))}
        response = self._send("GET", path, q, None, "application/json", timeout_s + 10)
        if not 200 <= int(response.status) < 300:
            raise error_from(int(response.status), str(response.reason or ""), response.read())
        return self._events(path, response)

    def _events(self, path: str, response: Any) -> Iterator[Obj]:
        raw: Any = response.response
        pending = b""
        try:
            for chunk in raw.stream(None, decode_content=True):  # as each chunk arrives
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield _watch_event(json.loads(line))
        except NETWORK_ERRORS as exc:
            raise ApiError(0, "Unreachable", f"watch on {path} ended: {exc}") from exc
        finally:
            raw.release_conn()

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Obj | None,
        content_type: str,
        timeout_s: float,
    ) -> Any:
        from kubernetes.client.exceptions import ApiException

        verb, resource = request_labels(method, path, query)
        try:
            method, url, headers, body_s, post = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query.items()) if query else None,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(
                method, url, header_params=headers, body=body_s, post_params=post,
                _request_timeout=timeout_s,
            )  # fmt: skip
        except ApiException as exc:
            self.requests.add(verb, resource, int(getattr(exc, "status", 0) or 0))
            raise _api_error(exc) from exc
        except NETWORK_ERRORS as exc:  # connection refused, TLS, timeouts
            self.requests.add(verb, resource, 0)
            raise ApiError(
                0, "Unreachable", f"cannot reach the apiserver {self.host}: {exc}"
            ) from exc
        self.requests.add(verb, resource, int(response.status))
        return response

    def _ns(self, kind: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{self.namespace}/{_PATHS[kind]}"
        return f"{base}/{name}" if name else base

    # -- KubeApi ---------------------------------------------------------------------------

    def list_nodes(self) -> list[Obj]:
        return list(self.request("GET", "/api/v1/nodes").get("items", []))

    def list_pods_all_namespaces(
        self, field_selector: str = "", label_selector: str = ""
    ) -> list[Obj]:
        query = {k: v for k, v in (("fieldSelector", field_selector),
                                   ("labelSelector", label_selector)) if v}  # fmt: skip
        return list(self.request("GET", "/api/v1/pods", query=query or None).get("items", []))

    def list_pods(self, label_selector: str) -> list[Obj]:
        return self.list("pods", label_selector)

    def list_pods_in(self, namespace: str, label_selector: str) -> list[Obj]:
        path = f"/api/v1/namespaces/{namespace}/pods"
        query = {"labelSelector": label_selector}
        return list(self.request("GET", path, query=query).get("items", []))

    def bearer_token(self) -> str | None:
        # auth_settings runs the in-cluster configuration's refresh hook, which re-reads
        # the projected token file when it is due (tokens rotate hourly)
        value = self.api_client.configuration.auth_settings().get("BearerToken", {}).get("value")
        if not value:
            return None
        scheme, _, token = str(value).strip().partition(" ")  # "Bearer x"; in-cluster "bearer x"
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def get_pod(self, name: str) -> Obj:
        return self.get("pods", name)

    def create(self, kind: str, body: Obj) -> Obj:
        return self.request("POST", self._ns(kind), body=body)

    def get(self, kind: str, name: str) -> Obj:
        return self.request("GET", self._ns(kind, name))

    def list(self, kind: str, label_selector: str) -> list[Obj]:
        query = {"labelSelector": label_selector}
        return list(self.request("GET", self._ns(kind), query=query).get("items", []))

    def delete(
        self, kind: str, name: str, propagation: str = "Background", grace_s: int | None = None
    ) -> None:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        self.request("DELETE", self._ns(kind, name), body=body)

    def patch_resize(self, name: str, patch: Obj) -> Obj:
        return self.request(
            "PATCH",
            self._ns("pods", name) + "/resize",
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )

    def exec(self, pod: str, container: str, argv: Sequence[str], timeout_s: float) -> ExecResult:
        out: list[bytes] = []
        err: list[bytes] = []
        code = self._exec_stream(pod, container, argv, out.append, err.append, timeout_s)
        return ExecResult(code, b"".join(out).decode(errors="replace"),
                          b"".join(err).decode(errors="replace"))  # fmt: skip

    def exec_attached(
        self,
        pod: str,
        container: str,
        argv: Sequence[str],
        connect_retry_s: float = 0.0,
        abandoned: Callable[[], bool] | None = None,
    ) -> int:
        """Run ``argv`` in a container with its output streamed to ours (the rsh agent).
        While the apiserver cannot be reached (or answers 429/5xx) before the command has
        started, connecting is tried again for up to ``connect_retry_s`` (nothing ran yet,
        so nothing runs twice); a stream that breaks once started is not. ``abandoned``
        (checked before each try and about once a second while streaming): nobody waits
        for the command any more (the rsh agent's mpirun died): stop, ApiError
        ``Abandoned``, rather than start a command or hold a stream for no one."""
        return self._exec_stream(
            pod, container, argv, _writer(sys.stdout.buffer), _writer(sys.stderr.buffer), None,
            connect_retry_s, abandoned,
        )  # fmt: skip

    def _exec_stream(
        self,
        pod: str,
        container: str,
        argv: Sequence[str],
        on_out: Any,
        on_err: Any,
        timeout_s: float | None,
        connect_retry_s: float = 0.0,
        abandoned: Callable[[], bool] | None = None,
    ) -> int:
        from kubernetes.stream.ws_client import ERROR_CHANNEL

        def check_wanted() -> None:
            if abandoned is not None and abandoned():
                raise ApiError(0, "Abandoned", f"exec in pod {pod}: nobody waits for it any more")

        ws = self._open_exec(pod, container, argv, connect_retry_s, check_wanted)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while ws.is_open():
                ws.update(timeout=1)
                if ws.peek_stdout():
                    on_out(ws.read_stdout().encode())
                if ws.peek_stderr():
                    on_err(ws.read_stderr().encode())
                if deadline is not None and time.monotonic() > deadline:
                    raise ApiError(0, "Timeout", f"exec in pod {pod} took over {timeout_s} s")
                check_wanted()
            for channel, sink in ((1, on_out), (2, on_err)):  # what arrived with the close
                rest = ws.read_channel(channel)
                if rest:
                    sink(rest.encode() if isinstance(rest, str) else rest)
            status_text = ws.read_channel(ERROR_CHANNEL)
        finally:
            ws.close()
        return _exec_code(status_text)

    def _open_exec(
        self,
        pod: str,
        container: str,
        argv: Sequence[str],
        connect_retry_s: float,
        check_wanted: Callable[[], None],
    ) -> Any:
        """The exec's websocket, open (the command started). While the apiserver cannot
        be reached (or answers 429/5xx, or 403 right after it came back), connecting is
        tried again for up to ``connect_retry_s``: nothing ran yet, so nothing runs twice."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream
        from websocket import WebSocketException

        exec_errors: tuple[type[Exception], ...] = (*NETWORK_ERRORS, WebSocketException)

        # `stream` swaps the request method of the ApiClient it is given for a websocket
        # while it runs: a private client per exec keeps concurrent REST calls (the poller,
        # other execs) on plain HTTP.
        core = client.CoreV1Api(client.ApiClient(self.api_client.configuration))
        give_up = time.monotonic() + connect_retry_s
        delay = 0.5
        away = False  # the apiserver did not answer an earlier try
        refused_until: float | None = None
        while True:
            check_wanted()
            self.requests.add("create", "pods/exec")
            try:
                ws = stream(
                    core.connect_get_namespaced_pod_exec,
                    pod,
                    self.namespace,
                    container=container,
                    command=list(argv),
                    stdin=False,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                )
                return ws
            except ApiException as exc:
                error = _exec_error(exc)
                cause: Exception = exc
            except exec_errors as exc:
                error = ApiError(0, "Unreachable", f"cannot exec in pod {pod}: {exc}")
                cause = exc
            now = time.monotonic()
            retry = error.transient
            if error.status == 403 and away:
                # an apiserver that has just started refuses until its authorizer has
                # synced (seen on the dev cluster: pods/exec forbidden right after a
                # restart): after it was away a refusal is tried again, for a while
                refused_until = refused_until or now + RESTART_REFUSALS_S
                retry = now < refused_until
            away = away or error.transient
            if not retry or now + delay > give_up:
                raise error from cause
            time.sleep(delay)  # not started: connecting again runs nothing twice
            delay = min(delay * 2, 5.0)


def _watch_event(event: Obj) -> Obj:
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise ApiError(int(status.get("code") or 0), str(status.get("reason") or ""),
                       str(status.get("message") or ""))  # fmt: skip
    return event


def _writer(stream: BinaryIO) -> Any:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def _exec_code(status_text: str) -> int:
    """The exit code in the exec error channel's Status (Success → 0)."""
    if not status_text:
        return 0
    try:
        status = json.loads(status_text)
    except ValueError:
        return 1
    if status.get("status") == "Success":
        return 0
    for cause in status.get("details", {}).get("causes", []):
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", "1"))
            except ValueError:
                return 1
    return 1


def _api_error(exc: Any) -> ApiError:
    status = int(getattr(exc, "status", 0) or 0)
    return error_from(status, str(getattr(exc, "reason", "") or ""), getattr(exc, "body", None))


RESTART_REFUSALS_S = 30.0
"""How long an exec refused (403) right after the apiserver came back is tried again."""


def _exec_error(exc: Any) -> ApiError:
    """An exec that could not start: the websocket client reports every failure as status
    0; a handshake the apiserver answered (403, 404, 5xx) carries its real status."""
    from websocket import WebSocketBadStatusException

    bad = exc.__context__
    if isinstance(bad, WebSocketBadStatusException):
        body = getattr(bad, "resp_body", None)
        return error_from(
            int(bad.status_code), "", body.decode() if isinstance(body, bytes) else body
        )
    return _api_error(exc)
