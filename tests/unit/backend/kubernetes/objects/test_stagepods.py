"""The staging pod (`objects.stagepods`): the user's rights only, bounded."""

from __future__ import annotations

from pathlib import Path

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
IMAGE = "rankpack.local/rank:dev"


def _pod(**kw: object) -> dict:  # type: ignore[type-arg]
    args: dict = dict(image=IMAGE, volume=VOLUME, run_dir=RUN, case_root=CASES,  # type: ignore[type-arg]
                      bounds=StagingBounds(deadline_s=60))  # fmt: skip
    args.update(kw)
    return stagepods.staging_pod("s1", '{"case":"x"}', **args)


def test_it_mounts_its_run_directory_and_the_case_root_read_only_and_nothing_else() -> None:
    pod = _pod()
    (c,) = pod["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert set(mounts) == {str(RUN), str(CASES), "/tmp"}
    assert mounts[str(RUN)]["subPath"] == "runs/20261128-x-2r" and not mounts[str(RUN)].get(
        "readOnly")  # fmt: skip
    assert mounts[str(CASES)] == {"name": "case", "mountPath": str(CASES), "readOnly": True,
                                  "subPath": "cases"}  # fmt: skip
    assert all("hostPath" not in v for v in pod["spec"]["volumes"])


def test_it_has_no_token_a_restricted_read_only_root_and_bounds() -> None:
    pod = _pod()
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["activeDeadlineSeconds"] == 60 and spec["restartPolicy"] == "Never"
    sec = c["securityContext"]
    assert sec["runAsNonRoot"] and sec["readOnlyRootFilesystem"]
    assert sec["allowPrivilegeEscalation"] is False and sec["capabilities"] == {"drop": ["ALL"]}
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory", "ephemeral-storage"}
    assert c["command"] == ["rankpack-stage", '{"case":"x"}']  # no shell
    assert pod["metadata"]["labels"]["rankpack.dev/role"] == "staging"


def test_a_tutorial_mounts_no_case_root() -> None:
    (c,) = _pod(case_root=None)["spec"]["containers"]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {str(RUN), "/tmp"}


def test_a_case_root_off_a_host_volume_is_its_own_read_only_host_directory() -> None:
    pod = _pod(volume=HostPathVolume(Path("/var/lib/rankpack")), case_root=Path("/srv/cases"))
    (c,) = pod["spec"]["containers"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/srv/cases")
    assert mount["readOnly"] is True
    assert {"name": "cases", "hostPath": {"path": "/srv/cases", "type": "Directory"}} in pod[
        "spec"]["volumes"]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"image": DEV_IMAGE}, "holds no rankpack"),
        ({"run_dir": Path("/elsewhere/x")}, "not inside the volume"),
        ({"run_dir": Path("/var/lib/rankpack")}, "not inside the volume"),
        ({"case_root": Path("/srv/cases")}, "not on the run directories' volume"),
    ],
)
def test_what_cannot_be_a_sandbox_is_refused(kw: dict, said: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(BackendError, match=said):
        _pod(**kw)
