"""The staging pod (`objects.stagepods`): the user's rights only, bounded; staging's Python
in rankpack's image, the case's OpenFOAM in a sidecar of the Simulation's image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.config import (
    DEV_IMAGE,
    HostPathVolume,
    PvcVolume,
    StagingBounds,
)
from rankpack.backend.kubernetes.objects import stagepods
from rankpack.backend.protocol import BackendError

VOLUME = PvcVolume("rankpack-runs", Path("/var/lib/rankpack"))
RUN = Path("/var/lib/rankpack/runs/20261128-x-2r")
CASES = Path("/var/lib/rankpack/cases")
RANKPACK = "rankpack.local/rank:dev"
USERS = "registry.example/cfd/openfoam:12"
TOOLS = str(stagepods.TOOLS_DIR)


def _pod(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(image=USERS, tools_image=RANKPACK, volume=VOLUME, run_dir=RUN,
                                case_root=CASES, bounds=StagingBounds(deadline_s=60))  # fmt: skip
    args.update(kw)
    return stagepods.staging_pod("s1", '{"case":"x"}', **args)


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def _mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in c["volumeMounts"]}


RUN_MOUNT = {"name": "case", "mountPath": str(RUN), "subPath": "runs/20261128-x-2r"}
TOOLS_RO = {"name": "rankpack-tools", "mountPath": TOOLS, "readOnly": True}


@pytest.mark.parametrize(
    ("name", "init", "image", "command", "mounts"),
    [
        ("tools", True, RANKPACK, ["rankpack-stage", "--install-tools", TOOLS],
         {TOOLS: {"name": "rankpack-tools", "mountPath": TOOLS}}),
        ("openfoam", True, USERS,
         [f"{TOOLS}/rankpack-tools", "rankd", f"{TOOLS}/key", "--loopback"],
         {str(RUN): RUN_MOUNT, TOOLS: TOOLS_RO,
          "/tmp": {"name": "openfoam-tmp", "mountPath": "/tmp"}}),
        ("stage", False, RANKPACK, ["rankpack-stage", "--tools", TOOLS, '{"case":"x"}'],
         {str(RUN): RUN_MOUNT, TOOLS: TOOLS_RO, "/tmp": {"name": "tmp", "mountPath": "/tmp"},
          str(CASES): {"name": "case", "mountPath": str(CASES), "readOnly": True,
                       "subPath": "cases"}}),
    ],
)  # fmt: skip
def test_each_container_its_image_its_command_and_only_its_mounts(
    name: str, init: bool, image: str, command: list[str], mounts: dict[str, Any]
) -> None:
    """The init container and the main one run rankpack's image, the sidecar the
    Simulation's (no rankpack in it: the tools binary from the pod's own volume); the case
    root is the main container's alone, the tools read-only to all but their writer."""
    pod = _pod()
    c = _containers(pod)[name]
    where = pod["spec"]["initContainers" if init else "containers"]
    assert c in where and (c["image"], c["command"]) == (image, command)  # no shell
    assert _mounts(c) == mounts


def test_the_openfoam_sidecar_is_native_and_starts_after_the_tools_are_in_place() -> None:
    spec = _pod()["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["tools", "openfoam"]
    tools, openfoam = spec["initContainers"]
    assert openfoam["restartPolicy"] == "Always" and "restartPolicy" not in tools
    assert [c["name"] for c in spec["containers"]] == ["stage"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["rankpack-tools"] == {
        "name": "rankpack-tools",
        "emptyDir": {"sizeLimit": "64Mi"},
    }
    assert volumes["tmp"]["emptyDir"] and volumes["openfoam-tmp"]["emptyDir"]  # one each


@pytest.mark.parametrize("name", ["tools", "openfoam", "stage"])
def test_no_token_and_every_container_restricted_with_a_read_only_root(name: str) -> None:
    pod = _pod()
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["activeDeadlineSeconds"] == 60 and spec["restartPolicy"] == "Never"
    assert "hostNetwork" not in spec and "shareProcessNamespace" not in spec
    c = _containers(pod)[name]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
        "readOnlyRootFilesystem": True}  # fmt: skip
    assert all("serviceaccount" not in m["mountPath"] for m in c["volumeMounts"])
    assert all("hostPath" not in v and "projected" not in v for v in spec["volumes"])
    assert pod["metadata"]["labels"]["rankpack.dev/role"] == "staging"


@pytest.mark.parametrize(
    ("name", "requests", "limits"),
    [
        ("openfoam", {"cpu": "100m", "memory": "1024Mi", "ephemeral-storage": "512Mi"},
         {"cpu": "1000m", "memory": "2048Mi", "ephemeral-storage": "1024Mi"}),
        ("stage", {"cpu": "100m", "memory": "1024Mi", "ephemeral-storage": "512Mi"},
         {"cpu": "1000m", "memory": "2048Mi", "ephemeral-storage": "1024Mi"}),
        ("tools", stagepods.TOOLS_RESOURCES["requests"], stagepods.TOOLS_RESOURCES["limits"]),
    ],
)  # fmt: skip
def test_each_container_is_bounded_the_two_at_work_each_as_staging_was(
    name: str, requests: dict[str, str], limits: dict[str, str]
) -> None:
    """Each of the two that work has staging's limits (a hostile tool gets no more than it
    did); their requests add up to what the pod asked before."""
    c = _containers(_pod())[name]
    assert c["resources"] == {"requests": requests, "limits": limits}


def test_dev_images_are_never_pulled_a_users_image_is() -> None:
    cs = _containers(_pod())
    assert cs["tools"]["imagePullPolicy"] == cs["stage"]["imagePullPolicy"] == "Never"
    assert "imagePullPolicy" not in cs["openfoam"]


def test_a_tutorial_mounts_no_case_root() -> None:
    cs = _containers(_pod(case_root=None))
    assert set(_mounts(cs["stage"])) == {str(RUN), TOOLS, "/tmp"}


def test_a_case_root_off_a_host_volume_is_its_own_read_only_host_directory() -> None:
    pod = _pod(volume=HostPathVolume(Path("/var/lib/rankpack")), case_root=Path("/srv/cases"))
    mount = _mounts(_containers(pod)["stage"])["/srv/cases"]
    assert mount["readOnly"] is True
    assert {"name": "cases", "hostPath": {"path": "/srv/cases", "type": "Directory"}} in pod[
        "spec"]["volumes"]  # fmt: skip
    assert "/srv/cases" not in _mounts(_containers(pod)["openfoam"])


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"image": DEV_IMAGE}, "holds no rankpack"),
        ({"tools_image": DEV_IMAGE}, "holds no rankpack"),
        ({"run_dir": Path("/elsewhere/x")}, "not inside the volume"),
        ({"run_dir": Path("/var/lib/rankpack")}, "not inside the volume"),
        ({"case_root": Path("/srv/cases")}, "not on the run directories' volume"),
    ],
)
def test_what_cannot_be_a_sandbox_is_refused(kw: dict[str, Any], said: str) -> None:
    with pytest.raises(BackendError, match=said):
        _pod(**kw)
