"""The dev cluster as a user meets it: Ready node, status JSON, idempotent `up`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rankpack.devcluster.layout import NODE_NAME
from rankpack.devcluster.lifecycle import clusterstate
from tests.cli_runner import rankpack
from tests.k8s.conftest import DevCluster


def test_status_json_reports_ready_node_and_allocatable(k8s: DevCluster) -> None:
    proc = rankpack("dev-cluster", "status", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ready"] is True
    assert data["version"] == "v1.36.3"
    assert data["kubeconfig"] == str(k8s.up_result.kubeconfig)
    assert data["service_account_kubeconfig"] == str(k8s.up_result.service_account_kubeconfig)
    [node] = data["nodes"]
    assert node["name"] == NODE_NAME
    assert node["kubelet_version"] == "v1.36.3"
    # No reservations are configured: allocatable is every core of this machine.
    assert node["allocatable_millis"] == (os.cpu_count() or 0) * 1000


def test_node_is_ready_through_the_api(k8s: DevCluster) -> None:
    from kubernetes import client

    node = client.CoreV1Api(k8s.admin_api()).read_node(NODE_NAME)
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    assert node.status.node_info.kubelet_version == "v1.36.3"
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"] == "10.200.0.1"


def test_up_again_says_already_up_and_exits_0(k8s: DevCluster) -> None:
    proc = rankpack("dev-cluster", "up", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stdout
    assert clusterstate.status(k8s.state_dir)["ready"] is True


def test_a_second_cluster_is_refused_with_one_line(k8s: DevCluster, tmp_path: object) -> None:
    proc = rankpack("dev-cluster", "--state-dir", str(tmp_path), "up", timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.count("\n") == 0, err
    assert "another cluster" in err or "ports in use" in err or "kubepods" in err


def test_an_image_archive_loaded_into_every_node_runs_in_a_pod(
    k8s: DevCluster, tmp_path: Path
) -> None:
    """`dev-cluster load-image` (issue 41): an archive written by `ctr images export` under a
    name no node has is imported into every node and a pod runs it without a registry."""
    import subprocess
    import time
    import uuid

    from kubernetes import client

    from rankpack.devcluster.layout import PAUSE_IMAGE, Layout
    from rankpack.devcluster.packages import tool

    layout = Layout(k8s.state_dir)
    node = layout.node(layout.recorded_nodes()[0])
    ctr = [tool("ctr"), "--address", str(node.containerd_socket), "--namespace", "k8s.io"]
    name = f"team.example/cfd/pause:{uuid.uuid4().hex[:8]}"
    archive = tmp_path / "pause.tar"
    for step in (["tag", PAUSE_IMAGE, name], ["export", str(archive), name], ["rm", name]):
        subprocess.run([*ctr, "images", *step], check=True, capture_output=True, timeout=120)
    proc = rankpack("dev-cluster", "load-image", str(archive), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert loaded["images"] == [name] and loaded["nodes"] == [NODE_NAME], loaded
    core = client.CoreV1Api(k8s.admin_api())
    pod = {"metadata": {"name": "loaded-image"}, "spec": {"containers": [
        {"name": "c", "image": name, "imagePullPolicy": "Never"}]}}  # fmt: skip
    core.create_namespaced_pod(k8s.namespace, pod)
    try:
        deadline = time.monotonic() + 60
        while core.read_namespaced_pod("loaded-image", k8s.namespace).status.phase != "Running":
            assert time.monotonic() < deadline, "the pod never ran the loaded image"
            time.sleep(1)
    finally:
        core.delete_namespaced_pod("loaded-image", k8s.namespace, grace_period_seconds=0)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not an archive")
    refused = rankpack("dev-cluster", "load-image", str(junk), timeout=60)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused
