"""The node agent's objects: exactly two host paths, least privilege, and the rules a caller
needs; the backend's choice of readings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rankpack.backend.kubernetes.api.config import KubernetesConfig, NodeFiles
from rankpack.backend.kubernetes.nodes.agents import AgentReadings
from rankpack.backend.kubernetes.nodes.readings import LocalReadings
from rankpack.backend.kubernetes.nodes.sources import choose
from rankpack.backend.kubernetes.objects.rbac import agent_caller_rules, node_agent_cluster_role
from rankpack.nodeagent.manifests import agent_objects, agent_yaml, main
from tests.fakeapi import FakeKubeApi
from tests.unit.backend.kubernetes.fakenode import FakeNodeFilesystems


def daemonset() -> dict:  # type: ignore[type-arg]
    (ds,) = [o for o in agent_objects("rankpack") if o["kind"] == "DaemonSet"]
    return ds


def test_the_daemonset_mounts_exactly_the_two_host_paths() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {"kubelet-pods": "/var/lib/kubelet/pods", "cgroup": "/sys/fs/cgroup"}
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["kubelet-pods"]["mountPath"] == "/var/lib/kubelet/pods"
    assert not mounts["kubelet-pods"].get("readOnly")  # the wait-mode word is written there
    assert mounts["cgroup"] == {"name": "cgroup", "mountPath": "/host/sys/fs/cgroup",
                                "readOnly": True}  # fmt: skip
    assert [v for v in pod["volumes"] if "hostPath" not in v] == [
        {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}
    ]
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    # the node's pids: a group pod's ranks are found and reniced by them (decision 0012)
    assert pod["hostPID"] is True


def test_the_agent_runs_with_least_privilege() -> None:
    ds = daemonset()
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    # DAC_OVERRIDE: the records' wait-mode word; SYS_NICE: lower a rank's nice (0012)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "SYS_NICE"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and not sc.get("privileged")
    assert c["image"] == "rankpack/rankpack:0.1.0"
    assert c["resources"]["requests"]["cpu"] == "100m"
    assert c["ports"] == [{"name": "http", "containerPort": 8475, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"name": "NODE_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]  # fmt: skip
    assert c["command"][:2] == ["rankpack", "node-agent"]
    assert "--cgroup-root" in c["command"] and "/host/sys/fs/cgroup" in c["command"]
    assert pod["serviceAccountName"] == "rankpack-node-agent"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "rankpack-node-agent"  # how agents.py finds it


def test_the_cluster_role_reads_pods_and_reviews_nothing_else() -> None:
    role = node_agent_cluster_role()
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert grants == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }  # fmt: skip
    assert agent_caller_rules() == [
        {"apiGroups": ["rankpack.dev"], "resources": ["ranks"], "verbs": ["get", "update"]}
    ]
    (binding,) = [o for o in agent_objects() if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rankpack-node-agent", "namespace": "rankpack"}
    ]


def test_the_yaml_is_the_builders(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    docs = list(yaml.safe_load_all((tmp_path / "node-agent.yaml").read_text()))
    assert docs == agent_objects()
    assert agent_yaml().startswith("# rankpack node agent")


# -- the backend's choice of readings ---------------------------------------------------------


def test_auto_reads_this_node_when_its_files_are_here(tmp_path: Path) -> None:
    files = FakeNodeFilesystems(tmp_path)
    here = NodeFiles(files.kubelet_root, files.cgroup_root, files.pods_cgroup)
    api = FakeKubeApi()
    assert isinstance(choose(api, KubernetesConfig(node_files=here)), LocalReadings)
    away = NodeFiles(tmp_path / "none", tmp_path / "none")
    chosen = choose(api, KubernetesConfig(node_files=away, namespace="runs"))
    assert isinstance(chosen, AgentReadings) and chosen.agent_namespace == "rankpack-system"
    beside = choose(api, KubernetesConfig(node_files=away, namespace="runs", agent_namespace=None))
    assert isinstance(beside, AgentReadings) and beside.agent_namespace == "runs"
    assert chosen.name == "node-agent"
    forced = choose(api, KubernetesConfig(node_files=here, readings="agent",
                                          agent_namespace="rankpack"))  # fmt: skip
    assert isinstance(forced, AgentReadings) and forced.agent_namespace == "rankpack"
    assert choose(api, KubernetesConfig(node_files=away, readings="node")).name == "node-local"


@pytest.mark.parametrize("mode", ["node", "agent", "auto"])
def test_placement_says_where_usage_comes_from(tmp_path: Path, mode: str) -> None:
    from rankpack.backend.kubernetes.backend import KubernetesBackend

    away = NodeFiles(tmp_path / "none", tmp_path / "none")
    config = KubernetesConfig(node_files=away, readings=mode)  # type: ignore[arg-type]
    backend = KubernetesBackend(FakeKubeApi(), config, background=False)
    want = "node-local" if mode == "node" else "node-agent"
    assert backend.placement()["usage"] == want
