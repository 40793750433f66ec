"""`rankpack operator` in the cluster: the Deployment of ``deploy/operator.yaml`` (its own
ServiceAccount and least-privilege Role), adapted to the dev cluster by
`manifests.DevCluster`, runs one Simulation to Succeeded with in-cluster configuration.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rankpack.devcluster.layout import HOST_USR_IMAGE
from rankpack.operator import manifests
from tests.k8s.operators import Env


def _apply(api: Any, ns: str, objects: list[dict[str, Any]]) -> None:
    from kubernetes import client

    core, rbac, apps = (
        client.CoreV1Api(api),
        client.RbacAuthorizationV1Api(api),
        client.AppsV1Api(api),
    )
    create = {
        "ServiceAccount": core.create_namespaced_service_account,
        "Role": rbac.create_namespaced_role,
        "RoleBinding": rbac.create_namespaced_role_binding,
        "Deployment": apps.create_namespaced_deployment,
    }
    for o in objects:
        create[o["kind"]](ns, o)


def _delete(api: Any, ns: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, rbac, apps = (
        client.CoreV1Api(api),
        client.RbacAuthorizationV1Api(api),
        client.AppsV1Api(api),
    )
    name = manifests.NAME
    deletes = (apps.delete_namespaced_deployment, rbac.delete_namespaced_role_binding,
               rbac.delete_namespaced_role, core.delete_namespaced_service_account)  # fmt: skip
    for delete in deletes:
        try:
            delete(name, ns, propagation_policy="Foreground")
        except ApiException as exc:
            if exc.status != 404:
                raise
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/name={name}")
        if not pods.items:
            return
        time.sleep(1)


def test_the_operator_deployment_runs_a_simulation(env: Env, tmp_path: Path) -> None:
    from kubernetes import client

    api = env.k8s.admin_api()
    ns = env.k8s.namespace
    core = client.CoreV1Api(api)
    dev = manifests.DevCluster(runs=tmp_path / "runs")
    objects = manifests.operator_objects(ns, image=HOST_USR_IMAGE, dev=dev, metrics_port=9466)
    _delete(api, ns)
    _apply(api, ns, objects)
    try:
        made = env.cli("submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2",
                       "--iterations", "60", "--json")  # fmt: skip
        assert made.returncode == 0, made.stderr
        (name,) = json.loads(made.stdout)["simulations"]

        def ended() -> bool:
            return env.status(name).get("phase") in ("Succeeded", "Failed")

        try:
            env.wait("the Simulation to end", ended, 420)
        finally:
            pods = core.list_namespaced_pod(
                ns, label_selector=f"app.kubernetes.io/name={manifests.NAME}"
            ).items
            logs = "".join(
                core.read_namespaced_pod_log(
                    p.metadata.name, ns, container="operator", tail_lines=60
                )
                for p in pods
                if p.status.phase in ("Running", "Succeeded", "Failed")
            )
            print(f"operator pod log:\n{logs}")
        st = env.status(name)
        assert st["phase"] == "Succeeded", (st, logs[-3000:])
        assert st["operator"].startswith(f"{manifests.NAME}-")  # the pod, by its name
        assert st["restarts"] == 0 and st["iterations"] == 60
        assert Path(st["runDir"]).is_relative_to(tmp_path / "runs")
        assert "leading" in logs
        env.wait("its Succeeded Event (posted after the status)",
                 lambda: "Succeeded" in [e.reason for e in env.events(name)], 60)  # fmt: skip
        reasons = [e.reason for e in env.events(name)]
        assert "Launched" in reasons and "Succeeded" in reasons, reasons
        print(f"events: {sorted(reasons)}")
    finally:
        _delete(api, ns)
