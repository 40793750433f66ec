"""The Kubernetes backend's least-privilege identity: ServiceAccount, Role, RoleBinding.

`backend_rbac` is the single source of the rules; ``deploy/`` holds the same objects as
kustomize manifests for real clusters, and a unit test checks the two agree.
`rankpack.devcluster.cluster.up` applies these objects to the dev cluster and calls
`service_account_kubeconfig` so that tests run the backend with the ServiceAccount's token
(TokenRequest API), never as cluster admin.
"""

from __future__ import annotations

from typing import Any

from rankpack.devcluster.configs import kubeconfig
from rankpack.devcluster.layout import NAMESPACE

SERVICE_ACCOUNT = "rankpack-backend"
ROLE = "rankpack-backend"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rankpack", "app.kubernetes.io/name": "rankpack"}

# (api group, resources, verbs): what the backend does, nothing more.
RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("", ("pods",), ("get", "list", "watch", "create", "delete", "patch")),
    ("", ("pods/resize",), ("get", "patch")),
    ("", ("pods/exec",), ("create", "get")),
    ("", ("pods/log",), ("get",)),
    ("", ("services", "configmaps"), ("get", "list", "watch", "create", "delete")),
    ("", ("events",), ("get", "list", "watch", "create")),
    # the namespace's CPU quota, planned within instead of learned from refusals (issue 26)
    ("", ("resourcequotas",), ("get", "list")),
    # the operator (`rankpack operator`, issue 11): Simulations, their status, its Lease
    ("rankpack.dev", ("simulations",), ("get", "list", "watch", "create", "patch")),
    ("rankpack.dev", ("simulations/status",), ("get", "patch", "update")),
    ("coordination.k8s.io", ("leases",), ("get", "create", "update")),
)


def role_rules() -> list[dict[str, Any]]:
    """`RULES` as a Role's ``rules``: the backend's Role and the operator's (deploy/)."""
    return [
        {"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}
        for group, resources, verbs in RULES
    ]


def backend_rbac(namespace: str | None = None) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding; without `namespace` as in ``deploy/`` (kustomize
    sets the objects' namespace there)."""

    def meta(name: str) -> dict[str, Any]:
        m: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
        if namespace:
            m["namespace"] = namespace
        return m

    # kustomize's `namespace:` does not rewrite subjects (only those named "default"), so
    # the subject always names its namespace; deploy/ spells out "rankpack".
    subject = {
        "kind": "ServiceAccount",
        "name": SERVICE_ACCOUNT,
        "namespace": namespace or NAMESPACE,
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(SERVICE_ACCOUNT)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(ROLE),
            "rules": role_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(ROLE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
            "subjects": [subject],
        },
    ]


def namespace_object(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": dict(MANAGED_BY)},
    }


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
