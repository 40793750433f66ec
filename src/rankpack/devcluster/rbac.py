"""The backend's identity on the dev cluster: applies the product's RBAC objects.

The rules and objects are the product's (`rankpack.backend.kubernetes.rbac`, also written
into ``deploy/``); this module only sends them. `rankpack.devcluster.cluster.up` applies
them to the dev cluster and calls `service_account_kubeconfig` so that tests run the
backend with the ServiceAccount's token (TokenRequest API), never as cluster admin.
"""

from __future__ import annotations

from typing import Any

from rankpack.backend.kubernetes.rbac import (
    ROLE,
    SERVICE_ACCOUNT,
    backend_rbac,
    namespace_object,
    role_rules,
)
from rankpack.devcluster.configs import kubeconfig

__all__ = ["ROLE", "SERVICE_ACCOUNT", "apply", "apply_crd", "backend_rbac", "role_rules"]


def apply(api_client: Any, namespace: str) -> None:
    """Create the namespace and the backend's RBAC objects; existing ones are replaced."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api_client)  # bodies are plain dicts, as in deploy/
    rbac: Any = client.RbacAuthorizationV1Api(api_client)
    try:
        core.create_namespace(namespace_object(namespace))
    except ApiException as exc:
        if exc.status != 409:
            raise
    sa, role, binding = backend_rbac(namespace)
    calls: tuple[tuple[dict[str, Any], Any, Any], ...] = (
        (sa, core.create_namespaced_service_account, core.replace_namespaced_service_account),
        (role, rbac.create_namespaced_role, rbac.replace_namespaced_role),
        (binding, rbac.create_namespaced_role_binding, rbac.replace_namespaced_role_binding),
    )
    for body, create, replace in calls:
        try:
            create(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            replace(body["metadata"]["name"], namespace, body)


def apply_crd(api_client: Any) -> None:
    """Install (or update) the Simulation CRD: cluster-scoped, so done as the admin."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from rankpack.operator.crd import crd_manifest

    ext: Any = client.ApiextensionsV1Api(api_client)
    body = crd_manifest()
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)


def mint_token(api_client: Any, namespace: str, expiration_s: int) -> str:
    """A bound token for the backend's ServiceAccount (TokenRequest API)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_s)
    )
    result: Any = core.create_namespaced_service_account_token(SERVICE_ACCOUNT, namespace, request)
    return str(result.status.token)


def service_account_kubeconfig(
    api_client: Any, *, server: str, ca_pem: str, namespace: str, expiration_s: int = 86400
) -> dict[str, Any]:
    """A kubeconfig that authenticates as the backend's ServiceAccount, in its namespace."""
    token = mint_token(api_client, namespace, expiration_s)
    return kubeconfig(
        server=server,
        ca_pem=ca_pem,
        user=f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}",
        token=token,
        namespace=namespace,
    )
