"""Bounded waits, and the probes they poll: an HTTP health endpoint, a node Ready, the
default ServiceAccount; the admin's REST client those use.

Called by `bringup` (every start phase), `nodes` (`start-node`: containerd, node Ready),
`restarts` (the apiserver's /readyz) and `clusterstate` (the admin's client).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.objects import status as readings
from rankpack.devcluster import processes
from rankpack.devcluster.layout import NAMESPACE, Layout
from rankpack.errors import UserError

APISERVER_READYZ = "https://127.0.0.1:6443/readyz"


def wait_for(
    what: str, check: Callable[[], bool], timeout_s: float, layout: Layout, log: str
) -> None:
    """Poll `check` until true; fail early if a component died, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [c for c in _started(layout) if processes.read_pid(layout.pid_for(c)) is None]
        if dead:
            raise UserError(
                f"{dead[0]} exited while waiting for {what}; see {layout.log_for(dead[0])}"
            )
        time.sleep(0.25)
    raise UserError(f"timed out after {timeout_s:.0f} s waiting for {what}; see {log}")


def _started(layout: Layout) -> list[str]:
    return [c for c in layout.components() if layout.pid_for(c).exists()]


def http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def apiserver_ready(layout: Layout, token: str | None) -> Callable[[], bool]:
    """The check that the apiserver answers its /readyz (TLS against the cluster's CA)."""
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    return lambda: http_ok(APISERVER_READYZ, ctx, token)


def admin_token(layout: Layout) -> str | None:
    try:  # configs.dumps writes kubeconfigs as JSON (a subset of YAML)
        cfg = json.loads(layout.admin_kubeconfig.read_text())
        return str(cfg["users"][0]["user"]["token"])
    except (OSError, KeyError, IndexError, TypeError, ValueError):
        return None


def api_client(kubeconfig: Path) -> ClientKubeApi:
    """The admin's REST client (cluster-scoped calls; bounded, so a booting apiserver that
    hangs is one that does not answer)."""
    return ClientKubeApi(KubernetesConfig(kubeconfig=kubeconfig, namespace=NAMESPACE),
                         request_timeout_s=10.0)  # fmt: skip


def node_ready(api: ClientKubeApi, name: str) -> bool:
    try:
        node = api.request("GET", f"/api/v1/nodes/{name}")
    except ApiError:  # not registered yet, or the apiserver is still booting
        return False
    return readings.node_ready(node)


def default_service_account(api: ClientKubeApi, namespace: str) -> bool:
    try:
        api.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
    except ApiError:
        return False
    return True
