"""The Kubernetes backend's least-privilege identity: ServiceAccount, Role, RoleBinding.

`RULES` is the single source of what the backend (and the operator, which runs it) may do;
`NODE_AGENT_RULES` of what the node agent may do, `AGENT_CALLER_RULES` of what a caller of
the agents must be allowed (decision 0010).
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
    # the namespace's CPU quotas and LimitRanges, planned within instead of learned from
    # refusals (issue 26), watched into the backend's cache (issue 29)
    ("", ("resourcequotas", "limitranges"), ("get", "list", "watch")),
    # the operator (`rankpack operator`, issue 11): Simulations, their status, its Lease
    ("rankpack.dev", ("simulations",), ("get", "list", "watch", "create", "patch")),
    ("rankpack.dev", ("simulations/status",), ("get", "patch", "update")),
    ("coordination.k8s.io", ("leases",), ("get", "create", "update")),
)


Rules = tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]

NODE_AGENT = "rankpack-node-agent"
"""The node agent's ServiceAccount and ClusterRole (`rankpack.nodeagent`, decision 0010)."""
NODE_AGENT_RULES: Rules = (
    # its node's rank pods (listed with a field selector on spec.nodeName, all namespaces)
    ("", ("pods",), ("get", "list", "watch")),
    # who is calling (a bearer token) and may they (the ranks of a namespace): nothing else
    ("authentication.k8s.io", ("tokenreviews",), ("create",)),
    ("authorization.k8s.io", ("subjectaccessreviews",), ("create",)),
)
AGENT_CALLER_RULES: Rules = (("rankpack.dev", ("ranks",), ("get", "update")),)
"""What a caller of the node agents needs (the agent asks a SubjectAccessReview for them):
``get`` to read ``/v1/ranks`` of a namespace, ``update`` to set its simulations' wait modes.
``ranks`` is not an API resource; RBAC grants it like any name. Goes into the Role of the
identity that runs the backend (the operator's) in the rank pods' namespace."""


def rules_of(rules: Rules) -> list[dict[str, Any]]:
    return [
        {"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}
        for group, resources, verbs in rules
    ]


def role_rules() -> list[dict[str, Any]]:
    """`RULES` as a Role's ``rules``: the backend's Role and the operator's (deploy/)."""
    return rules_of(RULES)


def agent_caller_rules() -> list[dict[str, Any]]:
    """`AGENT_CALLER_RULES` as Role ``rules``, to add to the caller's Role."""
    return rules_of(AGENT_CALLER_RULES)


def node_agent_cluster_role() -> dict[str, Any]:
    """The node agent's ClusterRole: read pods, create token and access reviews."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NODE_AGENT, "labels": dict(MANAGED_BY)},
        "rules": rules_of(NODE_AGENT_RULES),
    }


def backend_rbac(namespace: str | None = None) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding; without `namespace` as in ``deploy/`` (kustomize
    sets the objects' namespace there)."""
    return identity(SERVICE_ACCOUNT, ROLE, role_rules(), namespace)


BACKEND_NODES_ROLE = "rankpack-backend-nodes"


def backend_nodes_rbac(namespace: str | None = None) -> list[dict[str, Any]]:
    """A ClusterRole to read nodes (their allocatable CPU and which are Ready: what placing
    ranks across nodes needs, issue 28) and its binding to the backend's ServiceAccount.
    Read-only and nodes only; apart from `backend_rbac`, whose Role stays namespaced."""
    meta = {"name": BACKEND_NODES_ROLE, "labels": dict(MANAGED_BY)}
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
               "namespace": namespace or DEPLOY_NAMESPACE}  # fmt: skip
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": dict(meta),
            "rules": rules_of((("", ("nodes",), ("get", "list", "watch")),)),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": dict(meta, labels=dict(MANAGED_BY)),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": BACKEND_NODES_ROLE,
            },
            "subjects": [subject],
        },
    ]


def identity(
    account: str, role: str, rules: list[dict[str, Any]], namespace: str | None
) -> list[dict[str, Any]]:
    """A namespaced identity: its ServiceAccount, a Role with ``rules`` and the binding."""

    def meta(name: str) -> dict[str, Any]:
        m: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
        if namespace:
            m["namespace"] = namespace
        return m

    # kustomize's `namespace:` does not rewrite subjects (only those named "default"), so
    # the subject always names its namespace; deploy/ spells out "rankpack".
    subject = {"kind": "ServiceAccount", "name": account,
               "namespace": namespace or DEPLOY_NAMESPACE}  # fmt: skip
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(account)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(role),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(role),
            "roleRef": role_ref,
            "subjects": [subject],
        },
    ]


def namespace_object(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": dict(MANAGED_BY)},
    }


# -- pod mode: the operator without pods/exec, and the launcher pods' identity --------------

OPERATOR_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = tuple(
    rule for rule in RULES if rule[1] != ("pods/exec",)
)
"""`RULES` without ``pods/exec``: the operator in pod mode (`KubernetesConfig.launcher`
``pod``) enters no pod; mpirun runs in each simulation's launcher pod, under
`LAUNCHER_SERVICE_ACCOUNT`; usage and duty cycles come from the node agents."""

LAUNCHER_SERVICE_ACCOUNT = "rankpack-launcher"
"""The identity of every launcher pod (``rankpack-<sim>-launcher``) in a namespace."""
LAUNCHER_ROLE = "rankpack-launcher"

LAUNCHER_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # wait until the rank pods run and learn their addresses; rankpack-exec (mpirun's rsh
    # agent) then enters each with the simulation's key (`keyed`, decision 0013): no
    # pods/exec, which would reach every pod of the namespace
    ("", ("pods",), ("get", "list", "watch")),
)
"""What a launcher pod may do in its namespace: read pods. Nothing it may create, change,
delete or enter (`tests/unit/backend/kubernetes/starting/test_podmode.py` pins this)."""


def launcher_rbac(namespace: str | None = None) -> list[dict[str, Any]]:
    """The launcher pods' ServiceAccount, Role and RoleBinding for one namespace (the
    admin's manifests install them in every namespace simulations run in; the operator
    never creates Roles). Without `namespace` as in ``deploy/`` (kustomize sets it)."""
    return identity(
        LAUNCHER_SERVICE_ACCOUNT, LAUNCHER_ROLE, _as_role_rules(LAUNCHER_RULES), namespace
    )


RANK_SERVICE_ACCOUNT = "rankpack-rank"
"""The identity of every rank pod (pod mode) in a namespace: no Role is bound to it and its
token is never mounted; it only keeps rank pods off the namespace's ``default`` account,
which an admin may have given rights."""


def rank_service_account(namespace: str | None = None) -> dict[str, Any]:
    """The rank pods' ServiceAccount (no rights, no token mounted)."""
    meta: dict[str, Any] = {"name": RANK_SERVICE_ACCOUNT, "labels": dict(MANAGED_BY)}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
            "automountServiceAccountToken": False}  # fmt: skip


def tenant_operator_rules() -> list[dict[str, Any]]:
    """The operator's rules in a namespace it serves besides its own: `OPERATOR_RULES`
    without its Lease (that lives in its own namespace), and being answered by the node
    agents about the namespace's ranks (`AGENT_CALLER_RULES`)."""
    own = tuple(rule for rule in OPERATOR_RULES if rule[0] != "coordination.k8s.io")
    return [*_as_role_rules(own), *rules_of(AGENT_CALLER_RULES)]


HOME_RULES: Rules = (
    ("coordination.k8s.io", ("leases",), ("get", "create", "update")),
    # its own pod (its image: the rank and launcher pods' default), and what else runs
    # there (counted in the inventory: it shares the nodes; listed once, then watched)
    ("", ("pods",), ("get", "list", "watch")),
)
"""The operator's rules in its own namespace when it serves only others (``deploy/tenants``):
its Lease, and reading pods."""


def operator_role_rules() -> list[dict[str, Any]]:
    """`OPERATOR_RULES` as a Role's ``rules`` (the operator's Role in pod mode)."""
    return _as_role_rules(OPERATOR_RULES)


def _as_role_rules(
    rules: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...],
) -> list[dict[str, Any]]:
    return [
        {"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}
        for group, resources, verbs in rules
    ]
