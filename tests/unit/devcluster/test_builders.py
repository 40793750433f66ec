"""The dev cluster's pure builders: spec in, object/text out. No cluster, no root needed."""

from __future__ import annotations

import base64
import io
import json
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from rankpack.backend.kubernetes.objects import rbac as backend_rbac_rules
from rankpack.devcluster import binaries, configs, rbac
from rankpack.devcluster.binaries import KubeVersion
from rankpack.devcluster.layout import NODE_IP, PAUSE_IMAGE, PORTS, Layout, node_specs
from rankpack.errors import UserError

REPO = Path(__file__).resolve().parents[3]
LAYOUT = Layout(Path("/srv/state"))
NODE = LAYOUT.node(node_specs(1, [0, 1])[0])

GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
\tgithub.com/example/other => github.com/example/fork v1.2.3
)
"""


@pytest.mark.parametrize(
    ("text", "tag", "staging"),
    [("v1.36.3", "v1.36.3", "v0.36.3"), (" v1.35.0 ", "v1.35.0", "v0.35.0")],
)
def test_version_parse(text: str, tag: str, staging: str) -> None:
    v = KubeVersion.parse(text)
    assert (v.tag, v.staging_tag) == (tag, staging)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.36.3", "not a Kubernetes release"),
        ("v1.36", "not a Kubernetes release"),
        ("v1.34.2", ">= v1.35"),
        ("v2.0.0", "not a Kubernetes release"),
    ],
)
def test_version_rejects(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        KubeVersion.parse(text)


def test_staging_modules_only_from_the_staging_replace_block() -> None:
    assert binaries.staging_modules(GO_MOD) == [
        "k8s.io/api",
        "k8s.io/client-go",
        "k8s.io/sample-cli-plugin",
    ]
    assert binaries.required_go(GO_MOD) == (1, 26)


def test_build_module_replaces_staging_with_published_versions() -> None:
    v = KubeVersion.parse("v1.36.3")
    text = binaries.build_module_go_mod(v, binaries.staging_modules(GO_MOD), (1, 26))
    assert "require k8s.io/kubernetes v1.36.3" in text
    assert "\tk8s.io/api => k8s.io/api v0.36.3" in text
    assert "\tk8s.io/client-go => k8s.io/client-go v0.36.3" in text
    assert "sample-cli-plugin" not in text
    assert "go 1.26\n" in text


def test_ldflags_stamp_both_version_packages() -> None:
    flags = binaries.ldflags(KubeVersion.parse("v1.36.3")).split(" -X ")
    assert flags[0] == "-s -w"
    stamped = dict(f.split("=", 1) for f in flags[1:])
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert stamped[f"{pkg}.gitVersion"] == "v1.36.3"
        assert stamped[f"{pkg}.gitMajor"] == "1"
        assert stamped[f"{pkg}.gitMinor"] == "36"


def test_cache_is_keyed_by_version_outside_checkout(tmp_path: Path) -> None:
    v = KubeVersion.parse("v1.36.3")
    assert binaries.bin_dir(v, tmp_path) == tmp_path / "kubernetes" / "v1.36.3" / "bin"
    assert not binaries.cached(v, tmp_path)
    d = binaries.bin_dir(v, tmp_path)
    d.mkdir(parents=True)
    for c in binaries.COMMANDS[:-1]:
        (d / c).write_text("")
        (d / c).chmod(0o755)
    assert not binaries.cached(v, tmp_path)  # one missing: a half cache is no cache
    (d / binaries.COMMANDS[-1]).write_text("")
    (d / binaries.COMMANDS[-1]).chmod(0o755)
    assert binaries.cached(v, tmp_path)
    assert not str(binaries.CACHE_ROOT).startswith(str(REPO))


def test_dirhash_matches_go_algorithm() -> None:
    # Go's dirhash.Hash1: sha256 over "<sha256 hex>  <name>\n" lines of the sorted file names.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("m@v1/b.txt", b"bee\n")
        zf.writestr("m@v1/a.txt", b"ay\n")
    import hashlib

    lines = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n"
        for name, data in sorted([("m@v1/a.txt", b"ay\n"), ("m@v1/b.txt", b"bee\n")])
    )
    want = "h1:" + base64.b64encode(hashlib.sha256(lines.encode()).digest()).decode()
    assert binaries.dirhash_h1(buf.getvalue()) == want


def test_containerd_config_is_toml_with_the_settings_that_matter() -> None:
    cfg = tomllib.loads(configs.containerd_config(NODE, "/usr/sbin/runc"))
    assert cfg["version"] == 2
    runtime = "/srv/state/nodes/rankpack-node/runtime/"
    assert cfg["root"].startswith(runtime) and cfg["state"].startswith(runtime)
    assert cfg["grpc"]["address"] == runtime + "containerd/containerd.sock"
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    opts = cri["containerd"]["runtimes"]["runc"]["options"]
    assert opts["SystemdCgroup"] is False and opts["Root"].startswith(runtime)
    assert cri["cni"]["conf_dir"] == "/srv/state/nodes/rankpack-node/config/cni"


def test_kubelet_config_for_cgroup_v1_without_systemd() -> None:
    cfg = configs.kubelet_config(LAYOUT, NODE)
    assert cfg["kind"] == "KubeletConfiguration"
    assert cfg["failCgroupV1"] is False
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["failSwapOn"] is False
    assert cfg["imageGCHighThresholdPercent"] == 100
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["address"] == NODE_IP
    assert cfg["containerRuntimeEndpoint"] == (
        "unix:///srv/state/nodes/rankpack-node/runtime/containerd/containerd.sock"
    )
    # one node: every CPU is its own, its pods below its own cgroup root
    assert cfg["cgroupRoot"] == "/rankpack-node"
    assert "reservedSystemCPUs" not in cfg
    assert (cfg["port"], cfg["healthzPort"]) == (10250, 10248)
    json.loads(configs.dumps(cfg))


def test_cni_conflist_bridge_host_local_under_state() -> None:
    cfg = configs.cni_conflist(NODE)
    bridge = cfg["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["bridge"] == "rankpack0"
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["dataDir"].startswith("/srv/state/nodes/rankpack-node/runtime/")
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.201.0.0/24", "gateway": "10.201.0.1"}]]


def test_component_argv_are_lists_with_state_paths() -> None:
    bin_dir = Path("/cache/bin")
    api = configs.apiserver_argv(LAYOUT, bin_dir)
    assert api[0] == "/cache/bin/kube-apiserver"
    assert "--authorization-mode=Node,RBAC" in api
    assert "--bind-address=127.0.0.1" in api
    assert any(a.startswith("--service-account-signing-key-file=/srv/state/") for a in api)
    assert "--unsafe-no-fsync" in configs.etcd_argv(LAYOUT)
    cm = configs.controller_manager_argv(LAYOUT, bin_dir)
    assert "--controllers=*,-nodeipam,-cloud-node-lifecycle" in cm
    assert "--leader-elect=false" in configs.scheduler_argv(LAYOUT, bin_dir)
    kubelet = configs.kubelet_argv(NODE, bin_dir)
    assert f"--node-ip={NODE_IP}" in kubelet
    assert (
        "--root-dir=/var/lib/kubelet" in kubelet and "--hostname-override=rankpack-node" in kubelet
    )
    assert {2379, 6443, 10250} <= set(PORTS)


def test_token_file_and_kubeconfig() -> None:
    idents = [
        configs.Identity("admin", ("system:masters",), "t1"),
        configs.Identity("system:kube-scheduler", (), "t2"),
    ]
    assert configs.token_file(idents) == (
        't1,admin,admin,"system:masters"\nt2,system:kube-scheduler,system:kube-scheduler,""\n'
    )
    kc = configs.kubeconfig(
        server="https://127.0.0.1:6443", ca_pem="PEM", user="u", token="t", namespace="ns"
    )
    assert kc["users"] == [{"name": "u", "user": {"token": "t"}}]
    assert kc["contexts"][0]["context"]["namespace"] == "ns"
    ca = kc["clusters"][0]["cluster"]["certificate-authority-data"]
    assert base64.b64decode(ca) == b"PEM"


def test_deploy_manifests_match_the_rbac_builder() -> None:
    top = yaml.safe_load((REPO / "deploy" / "kustomization.yaml").read_text())
    assert top["resources"] == ["base"]  # `kubectl apply -k deploy/` applies the base
    kustomization = yaml.safe_load((REPO / "deploy" / "base" / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert "backend.yaml" in kustomization["resources"]
    objects = list(yaml.safe_load_all((REPO / "deploy" / "base" / "backend.yaml").read_text()))
    assert objects == [*rbac.backend_rbac("rankpack"), *rbac.backend_nodes_rbac("rankpack")]


def test_every_deployed_object_names_its_namespace() -> None:
    """The base spans several namespaces (rankpack's own, the users'), so it sets none:
    every namespaced object names its own."""
    from rankpack.operator import deploy_files, manifests

    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "PriorityClass",
                      "ClusterRoleBinding", "PersistentVolume", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding", "Kustomization"}  # fmt: skip
    for name, text in deploy_files.files().items():
        if name.endswith(".json") or name == "monitoring/rules.yaml":
            continue  # a Grafana dashboard, a Prometheus rule file: no Kubernetes object
        for doc in yaml.safe_load_all(text):
            if doc["kind"] not in cluster_scoped:
                assert doc["metadata"].get("namespace"), (name, doc["kind"])
    ns = {d["metadata"]["name"]: d["metadata"]["labels"] for d in manifests.namespaces()}
    assert ns["rankpack-system"]["pod-security.kubernetes.io/enforce"] == "privileged"  # agents
    (users,) = [d for d in yaml.safe_load_all(deploy_files.files()["base/rankpack.yaml"])
                if d["kind"] == "Namespace"]  # fmt: skip
    assert users["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_rbac_is_least_privilege() -> None:
    objects = rbac.backend_rbac("ns")
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding"]  # never a ClusterRole
    role = objects[1]
    rules = {r: set(rule["verbs"]) for rule in role["rules"] for r in rule["resources"]}
    assert rules["pods/resize"] == {"get", "patch"}
    assert rules["pods/exec"] == {"create", "get"}
    assert "secrets" not in rules and "nodes" not in rules
    # apart: reading nodes, cluster-wide, and nothing else
    role, binding = rbac.backend_nodes_rbac("ns")
    assert role["kind"] == "ClusterRole" and role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rankpack-backend",
                                    "namespace": "ns"}]  # fmt: skip
    assert all("*" not in verbs for verbs in rules.values())
    binding = objects[2]
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": rbac.SERVICE_ACCOUNT, "namespace": "ns"}
    ]
    assert all(o["metadata"]["namespace"] == "ns" for o in objects)


def test_cli_registers_dev_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    from rankpack.cli import main

    assert main(["dev-cluster", "--help"]) == 0
    out = capsys.readouterr().out
    assert "up" in out and "down" in out and "status" in out


def test_cli_bad_version_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from rankpack.cli import main

    assert main(["dev-cluster", "up", "--version", "latest"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a Kubernetes release" in err


def test_deploy_crd_matches_the_builder() -> None:
    from rankpack.operator.crd import crd_manifest

    assert yaml.safe_load((REPO / "deploy" / "base" / "crd.yaml").read_text()) == crd_manifest()


def test_deploy_files_are_what_the_generator_writes() -> None:
    from rankpack.operator import deploy_files

    files = deploy_files.files()
    for name, text in files.items():
        assert (REPO / "deploy" / name).read_text() == text, name
    on_disk = {str(p.relative_to(REPO / "deploy")) for p in (REPO / "deploy").rglob("*")
               if p.is_file()}  # fmt: skip
    assert on_disk == set(files)  # nothing stale left in deploy/
    base = yaml.safe_load(files["base/kustomization.yaml"])
    shipped = {n.removeprefix("base/") for n in files if n.startswith("base/")}
    assert set(base["resources"]) == shipped - {"kustomization.yaml"}  # all of it applied


def test_the_dev_overlay_changes_only_images_and_the_volume() -> None:
    from rankpack.operator import deploy_files, manifests

    dev = yaml.safe_load(deploy_files.files()["dev/kustomization.yaml"])
    assert set(dev) == {"apiVersion", "kind", "resources", "images", "patches"}
    # two patches: the dev image's /usr host mount admitted in the rankpack namespace, and
    # the API's image allowlist naming the dev rank image (`images` renames only pod specs)
    assert dev["patches"] == [{"path": "namespace-patch.yaml"}, {"path": "admission-patch.yaml"}]
    patch = yaml.safe_load(deploy_files.files()["dev/namespace-patch.yaml"])
    relaxed = {"pod-security.kubernetes.io/enforce": "privileged"}
    assert patch["metadata"] == {"name": "rankpack", "labels": relaxed}
    admission = yaml.safe_load(deploy_files.files()["dev/admission-patch.yaml"])
    assert admission["metadata"] == {"name": "rankpack-admission", "namespace": "rankpack-system"}
    rank = manifests.DEV_IMAGES[manifests.RANK_IMAGE]
    assert admission["data"] == {"imagePrefixes": rank.rpartition(":")[0]}
    assert dev["resources"] == ["../base", "runs-pv.yaml"]
    assert {i["name"] for i in dev["images"]} == {"rankpack/rank", "rankpack/rankpack"}
    assert all(i["newName"].startswith("rankpack.local/") for i in dev["images"])
    pvs = list(yaml.safe_load_all(deploy_files.files()["dev/runs-pv.yaml"]))
    assert [pv["kind"] for pv in pvs] == ["PersistentVolume"] * 2
    assert [pv["spec"]["claimRef"] for pv in pvs] == [
        {"namespace": "rankpack-system", "name": manifests.RUNS_CLAIM},  # the operator's
        {"namespace": "rankpack", "name": manifests.RUNS_CLAIM},  # the users' namespace's
    ]


def test_in_cluster_operator_is_least_privilege() -> None:
    from rankpack.operator import manifests

    (sa, role, binding, nodes, nodes_binding, leases, leases_binding,
     deployment) = manifests.operator_objects("ns")  # fmt: skip
    assert [o["kind"] for o in (sa, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    # at home (where the agents run too): its Lease and reading pods, nothing else; what it
    # does in a served namespace is that namespace's Role (`tenant_manifests`)
    assert role["metadata"]["namespace"] == "ns"
    assert role["rules"] == backend_rbac_rules.rules_of(backend_rbac_rules.HOME_RULES)
    # the nodes' Leases (a lost node): reading them, in their namespace only
    assert leases["kind"] == "Role" and leases["metadata"]["namespace"] == "kube-node-lease"
    assert leases["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                "verbs": ["get", "list", "watch"]}]  # fmt: skip
    assert leases_binding["subjects"] == binding["subjects"]
    assert leases_binding["roleRef"]["name"] == leases["metadata"]["name"]
    granted = {r for rule in role["rules"] for r in rule["resources"]}
    assert granted == {"leases", "pods"}
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": manifests.NAME}  # fmt: skip
    # cluster-wide: reading nodes, nothing else
    assert nodes["kind"] == "ClusterRole"
    assert nodes["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                               "verbs": ["get", "list", "watch"]}]  # fmt: skip
    assert nodes_binding["roleRef"]["name"] == nodes["metadata"]["name"]
    assert nodes_binding["subjects"] == binding["subjects"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert "hostNetwork" not in pod and all("hostPath" not in v for v in pod["volumes"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == manifests.RANK_IMAGE
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "--volume" in container["command"] and "$(POD_NAME)" in container["command"]
    assert "--allocatable" not in container["command"]  # read from the nodes


def test_a_rollout_is_done_when_every_replica_is_updated_and_ready() -> None:
    from rankpack.devcluster.deploy import _rollout_done

    def dep(gen: int, seen: int, updated: int, available: int) -> dict[str, object]:
        return {"kind": "Deployment", "metadata": {"generation": gen}, "spec": {"replicas": 1},
                "status": {"observedGeneration": seen, "updatedReplicas": updated,
                           "availableReplicas": available}}  # fmt: skip

    assert _rollout_done(dep(2, 2, 1, 1))
    assert not _rollout_done(dep(2, 1, 1, 1))  # the controller has not seen the new spec
    assert not _rollout_done(dep(2, 2, 0, 1))  # the old pod still serves
    ds = {"kind": "DaemonSet", "metadata": {"generation": 1},
          "status": {"observedGeneration": 1, "desiredNumberScheduled": 2,
                     "updatedNumberScheduled": 2, "numberReady": 1}}  # fmt: skip
    assert not _rollout_done(ds)  # one node's agent not ready yet
    ds["status"]["numberReady"] = 2  # type: ignore[index]
    assert _rollout_done(ds)
    ds["status"]["desiredNumberScheduled"] = 0  # type: ignore[index]
    assert not _rollout_done(ds)  # no node at all: nothing runs
