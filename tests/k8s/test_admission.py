"""Admission on the dev cluster (issue 26), as a user who may only create, read and delete
Simulations: a host-root volume, a case path of /etc or /root, a shell as solver, an image
the admin did not allow and a Simulation too big for the cluster are each refused with a
reason code in their status, nothing is staged or created for them; a case whose
blockMeshDict would run a command is refused at staging (CaseNotConfined), and a valid
Simulation submitted after them runs. A budget that leaves a rank without CPU is refused by
the API itself (the CRD's CEL rule).
"""

from __future__ import annotations

import copy
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from rankpack.operator import crd
from rankpack.plan.submission import Submission
from tests.k8s.operators import Env

USER = "simulation-user"
PITZ = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")


def _user_api(env: Env) -> Any:
    """A client that holds only a Role on simulations (create/get/list/delete) in the
    namespace: what a less-privileged user of the operator has."""
    from kubernetes import client

    admin = env.k8s.admin_api()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    ns = env.k8s.namespace
    _remove_user(env)  # what an interrupted earlier run may have left
    core.create_namespaced_service_account(ns, {"metadata": {"name": USER}})
    rbac.create_namespaced_role(ns, {
        "metadata": {"name": USER},
        "rules": [{"apiGroups": [crd.GROUP], "resources": [crd.PLURAL],
                   "verbs": ["create", "get", "list", "delete"]}],
    })  # fmt: skip
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": USER},
        "subjects": [{"kind": "ServiceAccount", "name": USER, "namespace": ns}],
    })  # fmt: skip
    token = core.create_namespaced_service_account_token(
        USER, ns, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    # a configuration of its own: the admin's, loaded from a kubeconfig, carries a hook
    # that puts the admin's token back before every request
    conf = client.Configuration()
    conf.host = admin.configuration.host
    conf.ssl_ca_cert = admin.configuration.ssl_ca_cert
    conf.api_key = {"BearerToken": f"Bearer {token}"}
    return client.ApiClient(conf)


def _remove_user(env: Env) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    admin = env.k8s.admin_api()
    ns = env.k8s.namespace
    for delete in (client.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding,
                   client.RbacAuthorizationV1Api(admin).delete_namespaced_role,
                   client.CoreV1Api(admin).delete_namespaced_service_account):  # fmt: skip
        try:
            delete(USER, ns)
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_refused_specs_end_failed_with_a_reason_and_a_valid_one_runs(
    env: Env, tmp_path: Path
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ns = env.k8s.namespace
    try:
        user = client.CustomObjectsApi(_user_api(env))
        # the user may not read pods: its only rights are on simulations
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(user.api_client).list_namespaced_pod(ns)
        assert denied.value.status == 403

        tag = uuid.uuid4().hex[:6]
        small = Submission(case="pitzDaily", weights=(1.0, 1.0), budget_millis=1000,
                           iterations=30)  # fmt: skip
        specs = {
            f"root-{tag}": ("HostVolumeNotAllowed", {"case": {"path": "pitzDaily",
                                                              "volume": "host:/"}}),
            f"etc-{tag}": ("CasePathNotAllowed", {"case": {"path": "/etc"}}),
            f"home-{tag}": ("CasePathNotAllowed", {"case": {"path": "/root"}}),
            f"up-{tag}": ("CasePathNotAllowed", {"case": {"path": "../../../etc"}}),
            f"shell-{tag}": ("SolverNotAllowed", {"solver": "sh"}),
            f"image-{tag}": ("ImageNotAllowed", {"image": "evil.example/miner:1"}),
            f"huge-{tag}": ("DoesNotFit", {"ranks": 4096, "budgetMillis": 4096000,
                                           "weights": [1] * 4096}),
        }  # fmt: skip
        for name, (_, override) in specs.items():
            body = crd.simulation(name, small)
            body["spec"].update(copy.deepcopy(override))
            user.create_namespaced_custom_object(crd.GROUP, crd.VERSION, ns, crd.PLURAL, body)
        # a case under the allowed root whose blockMeshDict would run a command at staging
        coded = env.tmp / f"coded-{tag}"
        shutil.copytree(PITZ, coded)
        mesh = coded / "system" / "blockMeshDict"
        code = 'scale #codeStream { code #{ system("id"); os << 0.001; #}; };'
        mesh.write_text(mesh.read_text().replace("scale   0.001;", code))
        confined = f"coded-{tag}"
        body = crd.simulation(confined, small)
        body["spec"]["case"] = {"path": str(coded)}
        user.create_namespaced_custom_object(crd.GROUP, crd.VERSION, ns, crd.PLURAL, body)
        valid = f"valid-{tag}"
        user.create_namespaced_custom_object(
            crd.GROUP, crd.VERSION, ns, crd.PLURAL, crd.simulation(valid, small)
        )
        # refused at the API, before the operator sees it: a rank would get 0m
        starved = crd.simulation(f"starved-{tag}", small)
        starved["spec"].update(budgetMillis=1)
        with pytest.raises(ApiException) as invalid:
            user.create_namespaced_custom_object(crd.GROUP, crd.VERSION, ns, crd.PLURAL, starved)
        assert invalid.value.status == 422 and "at least 1m" in invalid.value.body

        op = env.operator("--until-idle", log=tmp_path / "op.log")
        assert op.wait(timeout=300) == 0, (tmp_path / "op.log").read_text()[-3000:]
        for name, (reason, _) in specs.items():
            st = env.status(name)
            assert st["phase"] == "Failed", (name, st)
            assert st["result"]["reason"] == reason, (name, st["result"])
            assert st["result"]["message"], name
            failed = {c["type"]: c for c in st["conditions"]}["Failed"]
            assert failed["reason"] == reason and failed["message"] == st["result"]["message"]
            assert "simId" not in st, (name, "nothing was staged or launched for it")
        st = env.status(confined)
        assert st["phase"] == "Failed" and st["result"]["reason"] == "CaseNotConfined", st
        assert st["result"]["message"].startswith("system/blockMeshDict:"), st["result"]
        assert "#codeStream compiles and runs code" in st["result"]["message"]
        assert env.status(valid)["phase"] == "Succeeded", env.status(valid)
        # one run only: the valid one; no pod ever mounted a host path it was not given
        runs = env.runs()
        assert [r[1] for r in runs] == ["completed"], runs
        print(f"\nrefused: { {n: env.status(n)['result']['reason'] for n in [*specs, confined]} }")
    finally:
        _remove_user(env)
        for o in env.simulations():
            env.custom.delete_namespaced_custom_object(
                crd.GROUP, crd.VERSION, ns, crd.PLURAL, o["metadata"]["name"]
            )


def test_the_admission_policy_refuses_host_volumes_and_case_paths_at_create(env: Env) -> None:
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from rankpack.operator.policy_manifest import admission_objects

    ns = env.k8s.namespace
    admin = env.k8s.admin_api()
    core, reg = client.CoreV1Api(admin), client.AdmissionregistrationV1Api(admin)
    # a policy of its own name: the apiserver's view of this one, once deleted, must not
    # shadow deploy/'s (the in-cluster module's), a different object of the usual name
    params, policy, binding = admission_objects(
        ns, ("/srv/rankpack",), ("/srv/cases",), ("registry.example/cfd", "other.example/"),
        name="rankpack-simulations-test")  # fmt: skip
    small = Submission(case="pitzDaily", weights=(1.0, 1.0), budget_millis=1000)

    def create(name: str, image: str | None = None, **case: str) -> ApiException | None:
        body = crd.simulation(name, small)
        body["spec"]["case"].update(case)
        if image is not None:
            body["spec"]["image"] = image
        try:
            user.create_namespaced_custom_object(crd.GROUP, crd.VERSION, ns, crd.PLURAL, body)
        except ApiException as exc:
            return exc
        env.custom.delete_namespaced_custom_object(crd.GROUP, crd.VERSION, ns, crd.PLURAL, name)
        return None

    user = client.CustomObjectsApi(_user_api(env))
    core.create_namespaced_config_map(ns, params)
    reg.create_validating_admission_policy(policy)
    reg.create_validating_admission_policy_binding(binding)
    try:
        deadline = time.monotonic() + 60  # the apiserver picks policies up asynchronously
        while create("probe", volume="host:/") is None:
            assert time.monotonic() < deadline, "the policy never took effect"
            time.sleep(1)
        refused = {
            "host-root": dict(volume="host:/"),
            "host-climb": dict(volume="host:/srv/rankpack/../../etc"),
            "host-sibling": dict(volume="host:/srv/rankpack-other"),
            "etc": dict(path="/etc"),
            "root": dict(path="/root"),
            "climb": dict(path="/srv/cases/../../etc"),
            "relative": dict(path="../../../etc"),
        }
        for name, case in refused.items():
            exc = create(name, **case)
            assert exc is not None and exc.status == 422, (name, exc)
            code = "HostVolumeNotAllowed" if "volume" in case else "CasePathNotAllowed"
            assert code in exc.body, (name, exc.body)
        for name, image in {"image-sibling": "registry.example/cfd-evil/foam:1",
                            "image-other": "evil.example/miner:1",
                            "image-suffix": "registry.example.evil/cfd:1"}.items():  # fmt: skip
            exc = create(name, image=image)
            assert exc is not None and exc.status == 422 and "ImageNotAllowed" in exc.body, (
                name, exc)  # fmt: skip
        for name, case in {"tutorial": {}, "allowed-host": dict(volume="host:/srv/rankpack/r"),
                           "allowed-case": dict(path="/srv/cases/mine")}.items():  # fmt: skip
            assert create(name, **case) is None, name
        for name, image in {"image-repo": "registry.example/cfd/foam:12",
                            "image-tag": "registry.example/cfd:12",
                            "image-registry": "other.example/any/thing:1"}.items():  # fmt: skip
            assert create(name, image=image) is None, name
    finally:
        reg.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        reg.delete_validating_admission_policy(policy["metadata"]["name"])
        core.delete_namespaced_config_map(params["metadata"]["name"], ns)
        # the next tests submit case paths of their own: wait until the policy is gone
        deadline = time.monotonic() + 60
        while create("probe-gone", path="/tmp/case") is not None and time.monotonic() < deadline:
            time.sleep(1)
        _remove_user(env)
