"""deploy/base's rankpack namespace, deploy/tenants and deploy/dev-tenants (issue 26, item
7; issue 39): the operator in its own namespace, serving others. Each served namespace gets
the operator's Role and RoleBinding (bound to the operator's ServiceAccount in its own
namespace), the launcher pods' and the rank pods' identities, and a claim that binds only
that namespace's volume; the operator is patched to serve exactly those namespaces with a
layout its own check accepts; nothing is cluster-wide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rankpack.backend.kubernetes.objects import rbac
from rankpack.cli import build_parser
from rankpack.operator import deploy_files, manifests, tenant_manifests
from rankpack.operator.admission import AdmissionPolicy
from rankpack.operator.tenancy import Tenancy, parse_namespaces

EXAMPLE = tenant_manifests.EXAMPLE


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(deploy_files.files()[name]) if d]


def test_each_served_namespace_gets_its_identities_and_its_own_claim() -> None:
    for ns, name in [*((ns, f"tenants/{ns}.yaml") for ns in EXAMPLE),
                     (rbac.DEPLOY_NAMESPACE, f"base/{rbac.DEPLOY_NAMESPACE}.yaml")]:  # fmt: skip
        docs = _docs(name)
        kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
        assert kinds == sorted([
            ("Namespace", ns), ("Role", "rankpack-operator"), ("RoleBinding", "rankpack-operator"),
            ("ServiceAccount", "rankpack-launcher"), ("Role", "rankpack-launcher"),
            ("RoleBinding", "rankpack-launcher"), ("ServiceAccount", "rankpack-rank"),
            ("PersistentVolumeClaim", manifests.RUNS_CLAIM),
        ])  # fmt: skip
        by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        assert all(d["metadata"].get("namespace") == ns for d in docs if d["kind"] != "Namespace")
        labels = by[("Namespace", ns)]["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        role = by[("Role", "rankpack-operator")]
        granted = {(r, v) for rule in role["rules"] for r in rule["resources"]
                   for v in rule["verbs"]}  # fmt: skip
        assert ("pods", "create") in granted and ("simulations/status", "patch") in granted
        assert ("ranks", "get") in granted  # the node agents answer it about this namespace
        assert not {r for r, _ in granted} & {"leases", "pods/exec", "secrets"}
        binding = by[("RoleBinding", "rankpack-operator")]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": manifests.NAME,
                                        "namespace": manifests.SYSTEM_NAMESPACE}]  # fmt: skip
        assert by[("ServiceAccount", "rankpack-rank")]["automountServiceAccountToken"] is False
        claim = by[("PersistentVolumeClaim", manifests.RUNS_CLAIM)]["spec"]
        assert claim["storageClassName"] == ""  # never a fresh, empty provisioned volume
        assert claim["selector"] == {"matchLabels": {tenant_manifests.RUNS_OF: ns}}


def test_the_operator_serves_exactly_them_with_its_checked_layout() -> None:
    (patch,) = _docs("tenants/operator-patch.yaml")
    (base,) = [d for d in _docs("base/operator.yaml") if d["kind"] == "Deployment"]
    for doc, want in ((patch, EXAMPLE), (base, (rbac.DEPLOY_NAMESPACE,))):
        assert doc["metadata"]["namespace"] == manifests.SYSTEM_NAMESPACE
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        assert command[:2] == ["rankpack", "operator"]
        args = build_parser().parse_args(command[1:])
        served = parse_namespaces(args.namespace)
        assert served == want
        policy = AdmissionPolicy(case_roots=tuple(args.case_root))
        Tenancy(served, args.runs_root, args.volume).check(policy)  # what the operator checks
        # everything of a namespace lies below its own part of the operator's volume
        for ns in served:
            root = f"{manifests.RUNS_PATH}/namespaces/{ns}"
            assert Tenancy(served, args.runs_root, args.volume).volume_of(ns) == (
                f"pvc:{manifests.RUNS_CLAIM}:{root}")  # fmt: skip
            assert policy.case_roots[0].replace("{namespace}", ns) == f"{root}/cases"
        # the API's own check, per namespace, the same
        params = [d for d in _docs("base/admission.yaml") if d["kind"] == "ConfigMap"]
        assert params[0]["data"]["caseRoots"] == policy.case_roots[0]


def test_in_its_own_namespace_the_operator_keeps_its_lease_and_reading_pods() -> None:
    docs = _docs("base/operator.yaml")
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == manifests.NAME]
    assert role["metadata"]["namespace"] == manifests.SYSTEM_NAMESPACE
    # its store on its own claim there, which no user's pod mounts (theirs are their own)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == [manifests.RUNS_CLAIM]
    (claim,) = _docs("base/runs-pvc.yaml")
    assert claim["metadata"]["namespace"] == manifests.SYSTEM_NAMESPACE
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # a standby on another node
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["RANKPACK_DB"] == f"{manifests.RUNS_PATH}/operator.db"
    assert not env["RANKPACK_DB"].startswith(manifests.tenant_path(""))
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]  # fmt: skip


def test_a_leader_and_a_standby_kept_apart_where_there_are_nodes() -> None:
    (deployment,) = [d for d in _docs("base/operator.yaml") if d["kind"] == "Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # replaced one at a time: never both gone at once (Recreate would stop both)
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti  # one node runs both
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = spec["template"]["metadata"]["labels"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    # each its own identity in the Lease: the pod's name
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--identity") + 1] == "$(POD_NAME)"


def test_the_overlays_list_their_files_and_nothing_cluster_wide() -> None:
    files = deploy_files.files()
    for overlay, base in (("tenants", "../base"), ("dev-tenants", "../dev")):
        k = yaml.safe_load(files[f"{overlay}/kustomization.yaml"])
        assert k["resources"][0] == base
        listed = set(k["resources"][1:]) | {p["path"] for p in k["patches"]}
        shipped = {n.split("/", 1)[1] for n in files if n.startswith(f"{overlay}/")}
        assert listed == shipped - {"kustomization.yaml"}
        kinds = {d["kind"] for n in shipped - {"kustomization.yaml"}
                 for d in _docs(f"{overlay}/{n}")}  # fmt: skip
        assert not kinds & {"ClusterRole", "ClusterRoleBinding"}


def test_the_dev_volumes_are_each_namespaces_directory_below_the_operators() -> None:
    operators, *base = _docs("dev/runs-pv.yaml")
    assert operators["spec"]["claimRef"] == {"namespace": manifests.SYSTEM_NAMESPACE,
                                             "name": manifests.RUNS_CLAIM}  # fmt: skip
    assert operators["spec"]["hostPath"]["path"] == manifests.DEV_RUNS_DIR
    pvs = [*base, *_docs("dev-tenants/runs-pvs.yaml")]
    served = (rbac.DEPLOY_NAMESPACE, *EXAMPLE)
    assert [pv["spec"]["claimRef"] for pv in pvs] == [
        {"namespace": ns, "name": manifests.RUNS_CLAIM} for ns in served]  # fmt: skip
    for ns, pv in zip(served, pvs, strict=True):
        assert pv["metadata"]["labels"][tenant_manifests.RUNS_OF] == ns
        assert pv["spec"]["hostPath"] == {
            "path": f"{manifests.DEV_RUNS_DIR}/namespaces/{ns}", "type": "Directory"}  # fmt: skip


def test_an_overlay_for_other_namespaces_is_one_command(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    assert (
        deploy_files.main(["tenants", str(out), "lab-x,lab-y", "--base", "../../deploy/base"]) == 0
    )
    k = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert k["resources"] == ["../../deploy/base", "lab-x.yaml", "lab-y.yaml"]
    patch = yaml.safe_load((out / "operator-patch.yaml").read_text())
    command = patch["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--namespace") + 1] == "lab-x,lab-y"
    assert deploy_files.main(["tenants", str(out)]) == 2
