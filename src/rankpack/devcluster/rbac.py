"""The backend's identity on the dev cluster: applies the product's RBAC objects.

The rules and objects are the product's (`rankpack.backend.kubernetes.objects.rbac`,
also written into ``deploy/``); this module only sends them.
`rankpack.devcluster.lifecycle.bringup.up` applies them to the dev cluster and calls
`service_account_kubeconfig` so that tests run the backend with the ServiceAccount's token
(TokenRequest API), never as cluster admin.
"""

from __future__ import annotations

import contextlib
from typing import Any

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.kubeapi import Conflict
from rankpack.backend.kubernetes.objects.rbac import (
    ROLE,
    SERVICE_ACCOUNT,
    backend_nodes_rbac,
    backend_rbac,
    namespace_object,
    role_rules,
)
from rankpack.devcluster.configs import kubeconfig

__all__ = [
    "ROLE",
    "SERVICE_ACCOUNT",
    "apply",
    "apply_crd",
    "backend_nodes_rbac",
    "backend_rbac",
    "role_rules",
]


def apply(api: ClientKubeApi, namespace: str) -> None:
    """Create the namespace and the backend's RBAC objects; existing ones are replaced."""
    with contextlib.suppress(Conflict):
        api.request("POST", "/api/v1/namespaces", body=namespace_object(namespace))
    sa, role, binding = backend_rbac(namespace)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    for body, collection in (
        (sa, f"/api/v1/namespaces/{namespace}/serviceaccounts"),
        (role, f"{rbac}/roles"),
        (binding, f"{rbac}/rolebindings"),
    ):
        try:
            api.request("POST", collection, body=body)
        except Conflict:
            api.request("PUT", f"{collection}/{body['metadata']['name']}", body=body)
    # reading nodes, to place ranks across them (cluster-scoped: applied as the admin)
    cluster_rbac = "/apis/rbac.authorization.k8s.io/v1"
    role, binding = backend_nodes_rbac(namespace)
    for body, collection in (
        (role, f"{cluster_rbac}/clusterroles"),
        (binding, f"{cluster_rbac}/clusterrolebindings"),
    ):
        try:
            api.request("POST", collection, body=body)
        except Conflict:
            api.request("PUT", f"{collection}/{body['metadata']['name']}", body=body)


def apply_crd(api: ClientKubeApi) -> None:
    """Install (or update) the Simulation CRD: cluster-scoped, so done as the admin."""
    from rankpack.operator.crd import crd_manifest

    collection = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    body = crd_manifest()
    try:
        api.request("POST", collection, body=body)
    except Conflict:
        path = f"{collection}/{body['metadata']['name']}"
        current = api.request("GET", path)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.request("PUT", path, body=body)


def mint_token(api: ClientKubeApi, namespace: str, expiration_s: int) -> str:
    """A bound token for the backend's ServiceAccount (TokenRequest API)."""
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{SERVICE_ACCOUNT}/token"
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": expiration_s},
    }
    return str(api.request("POST", path, body=body)["status"]["token"])


def service_account_kubeconfig(
    api: ClientKubeApi, *, server: str, ca_pem: str, namespace: str, expiration_s: int = 86400
) -> dict[str, Any]:
    """A kubeconfig that authenticates as the backend's ServiceAccount, in its namespace."""
    token = mint_token(api, namespace, expiration_s)
    return kubeconfig(
        server=server,
        ca_pem=ca_pem,
        user=f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}",
        token=token,
        namespace=namespace,
    )
