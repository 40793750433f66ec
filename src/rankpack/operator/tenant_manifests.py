"""The admin's manifests for an operator serving several namespaces (issue 26, item 7).

``deploy/tenants/`` is a kustomize overlay of ``deploy/base`` that lists the namespaces the
operator serves (one file per namespace, generated from `namespace_objects`) and patches the
operator to serve exactly those, each with its own run directories; ``deploy/dev-tenants/``
is the same over ``deploy/dev``, with the dev cluster's volumes. The operator never creates
a Role or a RoleBinding itself: the admin applies these. Each served namespace gets

* the Namespace (PodSecurity ``restricted``),
* the operator's Role and RoleBinding there (`rbac.tenant_operator_rules`: rank and launcher
  pods, resizes, logs, Services, ConfigMaps, Events, quota read, Simulations and their
  status, being answered by the node agents about its ranks; no Lease, no ``pods/exec``),
  bound to the operator's ServiceAccount in its own namespace,
* the launcher pods' ServiceAccount, Role and RoleBinding, and the rank pods' ServiceAccount
  (no Role, no token),
* the claim ``rankpack-runs`` that the namespace's rank and launcher pods mount: it binds
  only a PersistentVolume labelled ``rankpack.dev/runs-of: <namespace>``, which the admin
  points at that namespace's part of the shared storage (``namespaces/<namespace>`` below
  what the operator's own claim holds), so that no pod of one namespace mounts another's
  run directories or cases.

In its own namespace the operator then keeps only its Lease and reading pods (`HOME_RULES`).
Another list of namespaces: ``python -m rankpack.operator.deploy_files tenants DIR NS...``
writes such an overlay into DIR (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankpack.backend.kubernetes.objects.rbac import (
    DEPLOY_NAMESPACE,
    HOME_RULES,
    launcher_rbac,
    rank_service_account,
    rules_of,
    tenant_operator_rules,
)
from rankpack.operator import manifests as m
from rankpack.operator.policy_manifest import PARAMS
from rankpack.operator.tenancy import FIELD

Obj = dict[str, Any]

EXAMPLE = ("team-a", "team-b")
"""The namespaces ``deploy/tenants`` and ``deploy/dev-tenants`` serve (an example: write
your own list with ``python -m rankpack.operator.deploy_files tenants``)."""
TENANT_ROOT = f"{m.RUNS_PATH}/namespaces/{FIELD}"
"""Where a served namespace's files live, in the operator (its claim holds every
namespace's) and in that namespace's pods (its own claim holds only its own)."""
RUNS_OF = "rankpack.dev/runs-of"
"""The label of the PersistentVolume a namespace's claim binds: the namespace's name."""


def operator_command(namespaces: Sequence[str]) -> list[str]:
    """The operator serving ``namespaces``, each with its own claim, run directories and
    case root."""
    return [
        "rankpack", "operator", "--identity", "$(POD_NAME)", "--metrics-port", str(m.METRICS_PORT),
        "--namespace", ",".join(namespaces),
        "--volume", f"pvc:{m.RUNS_CLAIM}:{TENANT_ROOT}",
        "--runs-root", f"{TENANT_ROOT}/runs",
        "--case-root", f"{TENANT_ROOT}/cases",
    ]  # fmt: skip


def namespace_objects(namespace: str, operator_namespace: str = DEPLOY_NAMESPACE) -> list[Obj]:
    """Everything one served namespace needs (see the module doc)."""
    meta = {"name": m.NAME, "namespace": namespace, "labels": dict(m.LABELS)}
    claim = m.runs_claim(namespace)
    claim["spec"].update(storageClassName="", selector={"matchLabels": {RUNS_OF: namespace}})
    return [
        m.namespace_object(namespace, m.RESTRICTED),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": tenant_operator_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": m.NAME},
         "subjects": [{"kind": "ServiceAccount", "name": m.NAME,
                       "namespace": operator_namespace}]},
        *launcher_rbac(namespace),
        rank_service_account(namespace),
        claim,
    ]  # fmt: skip


def operator_patch(namespaces: Sequence[str]) -> Obj:
    """The operator's Deployment serving ``namespaces`` (a strategic-merge patch: the
    container's command is replaced)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": m.NAME, "namespace": DEPLOY_NAMESPACE},
        "spec": {"template": {"spec": {"containers": [
            {"name": "operator", "command": operator_command(namespaces)},
        ]}}},
    }  # fmt: skip


def home_role_patch() -> Obj:
    """The operator's Role in its own namespace, which it no longer serves: its Lease and
    reading pods, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": m.NAME, "namespace": DEPLOY_NAMESPACE},
        "rules": rules_of(HOME_RULES),
    }


def admission_patch() -> Obj:
    """The API-level admission's case roots: each namespace's own."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PARAMS, "namespace": DEPLOY_NAMESPACE},
        "data": {"caseRoots": f"{TENANT_ROOT}/cases"},
    }


def dev_volume(namespace: str) -> Obj:
    """The dev cluster's volume of one namespace: its directory below the operator's."""
    pv = m.dev_runs_volume()
    pv["metadata"] = {"name": f"rankpack-dev-runs-{namespace}",
                      "labels": {**m.MANAGED, RUNS_OF: namespace}}  # fmt: skip
    pv["spec"]["claimRef"] = {"namespace": namespace, "name": m.RUNS_CLAIM}
    pv["spec"]["hostPath"] = {"path": f"{m.DEV_RUNS_DIR}/namespaces/{namespace}",
                              "type": "Directory"}  # fmt: skip
    return pv


HEADER = """\
# rankpack serving the Simulations of several namespaces (docs/deploy.md, docs/security.md):
#   kubectl apply -k {where}
# Each served namespace gets the operator's Role and RoleBinding, the launcher pods' and the
# rank pods' identities and the claim {claim} (bind it to a PersistentVolume
# labelled {label}=<namespace> on that namespace's part of the shared storage); the
# operator serves exactly these namespaces. Others: python -m rankpack.operator.deploy_files
# tenants DIR NS...
"""
GENERATED = """\
# Generated by `python -m rankpack.operator.deploy_files deploy` from
# src/rankpack/operator/tenant_manifests.py (a unit test keeps both identical): do not edit.
"""


def overlay(
    namespaces: Sequence[str], base: str = "../base", *, dev: bool = False, where: str = ""
) -> dict[str, str]:
    """The files of an overlay of ``base`` serving ``namespaces`` (with the dev cluster's
    host-directory volumes when ``dev``), by their path below the overlay."""
    per_ns = {f"{ns}.yaml": namespace_objects(ns) for ns in namespaces}
    resources = [base, *per_ns]
    if dev:
        resources.append("runs-pvs.yaml")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources,
        "patches": [{"path": "operator-patch.yaml"}, {"path": "home-role-patch.yaml"},
                    {"path": "admission-patch.yaml"}],
    }  # fmt: skip
    header = HEADER.format(where=where or "DIR", claim=m.RUNS_CLAIM, label=RUNS_OF) + GENERATED
    out = {
        "kustomization.yaml": m.docs(header, [kustomization]),
        **{name: m.docs(GENERATED, objs) for name, objs in per_ns.items()},
        "operator-patch.yaml": m.docs(GENERATED, [operator_patch(namespaces)]),
        "home-role-patch.yaml": m.docs(GENERATED, [home_role_patch()]),
        "admission-patch.yaml": m.docs(GENERATED, [admission_patch()]),
    }
    if dev:
        out["runs-pvs.yaml"] = m.docs(GENERATED, [dev_volume(ns) for ns in namespaces])
    return out


def files() -> dict[str, str]:
    """``deploy/tenants`` and ``deploy/dev-tenants``, by their path below ``deploy/``."""
    found = {f"tenants/{k}": v for k, v in overlay(EXAMPLE, where="deploy/tenants/").items()}
    dev = overlay(EXAMPLE, "../dev", dev=True, where="deploy/dev-tenants/")
    return {**found, **{f"dev-tenants/{k}": v for k, v in dev.items()}}
