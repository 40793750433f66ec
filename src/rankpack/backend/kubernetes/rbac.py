"""The Kubernetes backend's least-privilege identity: ServiceAccount, Role, RoleBinding.

`RULES` is the single source of what the backend (and the operator, which runs it) may do.
`rankpack.operator.manifests` writes these objects into ``deploy/`` for real clusters (a
unit test checks the two agree); the dev tool (`rankpack.devcluster.rbac`) applies them to
the dev cluster. Pure builders: objects in, nothing sent.
"""

from __future__ import annotations

from typing import Any

SERVICE_ACCOUNT = "rankpack-backend"
ROLE = "rankpack-backend"
DEPLOY_NAMESPACE = "rankpack"
"""The namespace ``deploy/`` names (kustomize may set another one for the objects)."""
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
        "namespace": namespace or DEPLOY_NAMESPACE,
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
