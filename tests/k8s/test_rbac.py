"""The backend's ServiceAccount may do its job in its namespace and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.conftest import DevCluster
from tests.k8s.pods import cpu_patch, delete_and_wait, sleeper_pod, wait_running


def forbidden(call: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value


def can_i(api: Any, verb: str, resource: str, namespace: str | None, sub: str = "") -> bool:
    from kubernetes import client

    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, subresource=sub or None, namespace=namespace
            )
        )
    )
    result = client.AuthorizationV1Api(api).create_self_subject_access_review(review)
    return bool(result.status.allowed)


def test_service_account_allowed_in_its_namespace(k8s: DevCluster) -> None:
    from kubernetes import client

    api = k8s.backend_api()
    ns = k8s.namespace
    assert can_i(api, "create", "pods", ns)
    assert can_i(api, "patch", "pods", ns, "resize")
    assert can_i(api, "create", "pods", ns, "exec")
    assert can_i(api, "get", "pods", ns, "log")
    assert can_i(api, "create", "configmaps", ns)
    assert can_i(api, "create", "services", ns)
    assert can_i(api, "create", "events", ns)
    # And really: create a pod, patch its resize subresource, delete it.
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, sleeper_pod("rbac-probe", 100))
    try:
        wait_running(core, "rbac-probe", ns)
        patch = cpu_patch("main", "150m")
        core.patch_namespaced_pod_resize(
            "rbac-probe", ns, patch, _content_type="application/strategic-merge-patch+json"
        )
    finally:
        delete_and_wait(core, "rbac-probe", ns)


def test_service_account_forbidden_elsewhere(k8s: DevCluster) -> None:
    from kubernetes import client

    api = k8s.backend_api()
    ns = k8s.namespace
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    # nodes it may read (get/list/watch: each node's allocatable, issue 28), never change
    core.list_node()
    assert not can_i(api, "patch", "nodes", None)
    assert not can_i(api, "delete", "nodes", None)
    forbidden(lambda: core.list_namespaced_secret(ns))
    forbidden(lambda: core.list_namespaced_pod("default"))
    forbidden(lambda: core.list_namespaced_pod("kube-system"))
    forbidden(lambda: core.list_pod_for_all_namespaces())
    forbidden(lambda: core.create_namespace({"metadata": {"name": "rankpack-escape"}}))
    forbidden(
        lambda: rbac.create_cluster_role({"metadata": {"name": "rankpack-escape"}, "rules": []})
    )
    forbidden(lambda: core.create_namespaced_pod("default", sleeper_pod("escape", 100)))
    assert not can_i(api, "create", "rolebindings", ns)  # cannot grant itself more
    assert not can_i(api, "update", "pods", ns, "status")
