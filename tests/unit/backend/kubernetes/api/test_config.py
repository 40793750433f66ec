"""KubernetesConfig defaults the way kubectl does; the case volume's typed choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.backend.kubernetes.api.config import (
    DEV_IMAGE,
    HostPathVolume,
    PvcVolume,
    load_config,
    parse_volume,
)
from rankpack.backend.kubernetes.starting.rsh import agent_script, split_args
from rankpack.errors import UserError

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: dev
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts:
  - {name: dev, context: {cluster: c, user: u, namespace: rankpack}}
  - {name: bare, context: {cluster: c, user: u}}
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.write_text(KUBECONFIG)
    return path


@pytest.mark.parametrize(
    ("context", "namespace", "want"),
    [(None, None, "rankpack"), ("bare", None, "default"), ("bare", "ns1", "ns1")],
    ids=["context-namespace", "no-namespace-default", "flag-wins"],
)
def test_namespace_defaults(
    kubeconfig: Path, context: str | None, namespace: str | None, want: str
) -> None:
    cfg = load_config(kubeconfig, context, namespace)
    assert cfg.namespace == want
    assert cfg.image == DEV_IMAGE


def test_kubeconfig_from_environment(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{kubeconfig}:{tmp_path / 'other'}")
    assert load_config().kubeconfig == kubeconfig


def test_missing_context_and_file_are_user_errors(kubeconfig: Path) -> None:
    with pytest.raises(UserError, match="no context 'x'"):
        load_config(kubeconfig, "x")
    with pytest.raises(UserError, match="does not exist"):
        load_config(kubeconfig.with_name("missing"))


CASE = Path("/runs/r1")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, HostPathVolume(CASE)),
        ("host:/runs", HostPathVolume(Path("/runs"))),
        ("pvc:runs", PvcVolume("runs", Path("/runs"))),
        ("pvc:runs:/", PvcVolume("runs", Path("/"))),
    ],
    ids=["default-case-dir", "host-dir", "pvc-at-runs-root", "pvc-at-root"],
)
def test_parse_volume(text: str | None, want: object) -> None:
    assert parse_volume(text, CASE) == want


@pytest.mark.parametrize(
    "text", ["nfs:x", "host:/elsewhere", "pvc:runs:relative"], ids=["kind", "outside", "relative"]
)
def test_bad_volumes(text: str) -> None:
    with pytest.raises(UserError):
        parse_volume(text, CASE)


def test_rsh_agent_arguments() -> None:
    assert split_args(["pod-1", "orted", "-mca", "ess", '"env"']) == (
        "pod-1",
        'orted -mca ess "env"',
    )
    assert split_args(["-x", "pod-1", "echo"]) == ("pod-1", "echo")
    assert agent_script("/venv/bin/python 3").endswith(
        "exec '/venv/bin/python 3' -m rankpack.backend.kubernetes.starting.rsh \"$@\"\n"
    )


def test_the_launcher_is_a_pod_unless_the_image_cannot_hold_one() -> None:
    from rankpack.backend.kubernetes.api.config import DEV_IMAGE, resolve_launcher
    from rankpack.errors import UserError

    assert resolve_launcher("auto", DEV_IMAGE) == "host"  # the host-usr image has no rankpack
    assert resolve_launcher("auto", "rankpack.local/rank:dev") == "pod"
    assert resolve_launcher("auto", "registry.example/rankpack/rank:0.1.0") == "pod"
    assert resolve_launcher("host", "rankpack.local/rank:dev") == "host"
    with pytest.raises(UserError, match="--launcher pod needs a rank image"):
        resolve_launcher("pod", DEV_IMAGE)
    with pytest.raises(UserError, match="not understood"):
        resolve_launcher("sideways", DEV_IMAGE)
