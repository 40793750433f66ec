"""No rankpack identity holds a right that would let it (or a user through it) escape its
namespace: every Role and ClusterRole shipped in deploy/ is checked against the list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"

FORBIDDEN_RESOURCES = {"secrets", "nodes/proxy", "serviceaccounts/token", "*"}
FORBIDDEN_VERBS = {"escalate", "bind", "impersonate", "*"}
CLUSTER_WIDE_FORBIDDEN = {"pods", "pods/exec", "pods/attach", "roles", "rolebindings"}
"""Resources a ClusterRole may not write: pod creation and exec only in its namespace."""
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def _roles() -> list[dict[str, Any]]:
    roles = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Role", "ClusterRole"):
                roles.append({**doc, "_file": str(path.relative_to(DEPLOY))})
    return roles


def _grants(role: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for rule in role.get("rules") or []:
        for resource in rule.get("resources") or []:
            out.extend((resource, verb) for verb in rule.get("verbs") or [])
    return out


def test_deploy_ships_roles() -> None:
    names = {r["metadata"]["name"] for r in _roles()}
    assert {"rankpack-backend", "rankpack-operator"} <= names, names


@pytest.mark.parametrize("role", _roles(), ids=lambda r: f"{r['_file']}:{r['metadata']['name']}")
def test_no_forbidden_right(role: dict[str, Any]) -> None:
    bad = [
        (resource, verb)
        for resource, verb in _grants(role)
        if resource in FORBIDDEN_RESOURCES
        or verb in FORBIDDEN_VERBS
        or (role["kind"] == "ClusterRole" and resource in CLUSTER_WIDE_FORBIDDEN and verb in WRITES)
    ]
    assert not bad, f"{role['kind']} {role['metadata']['name']} grants {bad}"
    for rule in role.get("rules") or []:
        assert "*" not in (rule.get("apiGroups") or []), rule
        assert not rule.get("nonResourceURLs"), rule


def test_nothing_binds_cluster_admin() -> None:
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
                assert doc["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), path


def test_the_served_namespaces_bindings_are_checked_too() -> None:
    """deploy/tenants (and dev-tenants): a Role and a RoleBinding per served namespace, each
    checked above; a binding there names a Role of its own namespace (never a ClusterRole),
    and its subjects are rankpack's own ServiceAccounts."""
    checked = {(r["_file"], r["metadata"].get("namespace"), r["metadata"]["name"])
               for r in _roles()}  # fmt: skip
    for overlay in ("tenants", "dev-tenants"):
        for ns in ("team-a", "team-b"):
            for role in ("rankpack-operator", "rankpack-launcher"):
                assert (f"{overlay}/{ns}.yaml", ns, role) in checked
    for path in sorted(DEPLOY.glob("*tenants/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            assert doc["kind"] == "RoleBinding", path  # never a cluster-wide grant
            assert doc["roleRef"]["kind"] == "Role", (path, doc["metadata"])
            for subject in doc["subjects"]:
                assert subject["kind"] == "ServiceAccount"
                assert subject["name"].startswith("rankpack-"), subject
