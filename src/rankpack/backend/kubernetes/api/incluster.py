"""`InClusterPods`: a namespace's pods listed by label, from inside a pod, on urllib3 alone.

The launcher pod's init container (`starting.launcher`) needs one call, a list of its
simulation's pods, and it stands on the start-up path of every launch (issue 38): in the
rank image, importing the official ``kubernetes`` client takes 0.8-0.9 s, more than the
rank pods take to start. This lists them with what that client itself is built on
(``urllib3``, 0.1 s to import) and the in-cluster configuration the client would load:
the apiserver from ``KUBERNETES_SERVICE_HOST``/``_PORT``, the ServiceAccount's token (read
again for each call: it rotates) and its CA at `SERVICE_ACCOUNT_DIR`. Everything else in
rankpack talks to the API through `client.ClientKubeApi`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import urllib3

from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj, error_from
from rankpack.backend.protocol import BackendError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_BODY = 16 << 20
"""The largest list answer read (a simulation's pods: a few kB each)."""


class InClusterPods:
    """``list_pods`` of `KubeApi`, for one namespace, as this pod's ServiceAccount."""

    def __init__(
        self,
        namespace: str,
        *,
        environ: Mapping[str, str] | None = None,
        account_dir: Path = SERVICE_ACCOUNT_DIR,
        timeout_s: float = 10.0,
    ) -> None:
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise BackendError(
                "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset"
            )
        self.token_file = account_dir / "token"
        ca = account_dir / "ca.crt"
        if not self.token_file.is_file() or not ca.is_file():
            raise BackendError(f"no ServiceAccount token and CA in {account_dir}")
        self.base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.namespace = namespace
        self.pool = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(ca),
            timeout=urllib3.Timeout(total=timeout_s),
            retries=False,
        )

    def list_pods(self, label_selector: str) -> list[Obj]:
        """The namespace's pods with ``label_selector``; `ApiError` on an error status, status
        0 when the apiserver cannot be reached."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        try:
            token = self.token_file.read_text().strip()
            response: Any = self.pool.request(
                "GET",
                self.base + path,
                fields={"labelSelector": label_selector},
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                preload_content=False,
            )
            try:
                body = response.read(MAX_BODY + 1)
            finally:
                response.release_conn()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "Unreachable", f"GET {path}: {exc}") from exc
        if not 200 <= int(response.status) < 300:
            raise error_from(int(response.status), str(response.reason or ""), body)
        if len(body) > MAX_BODY:
            raise ApiError(0, "TooLarge", f"GET {path}: more than {MAX_BODY} bytes")
        try:
            items = json.loads(body).get("items") or []
        except (ValueError, AttributeError) as exc:
            raise ApiError(0, "BadAnswer", f"GET {path}: not a pod list: {exc}") from exc
        return [item for item in items if isinstance(item, dict)]
