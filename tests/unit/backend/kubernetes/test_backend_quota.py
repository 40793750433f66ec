"""The Kubernetes backend within the namespace's ResourceQuotas and LimitRanges (issue 26,
item 5), against FakeKubeApi: a launch is checked before any create, and a create the
apiserver refuses halfway for quota leaves no partial gang."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.protocol import (
    LaunchFailed,
    LaunchRefused,
    RankResources,
    ResizeState,
    SimPhase,
    StagedCase,
    StageSpec,
)
from rankpack.backend.worker import _Stage
from rankpack.core.failures import FailureCode
from tests.fakeapi import FakeKubeApi
from tests.unit.backend.kubernetes.test_backend import PLACED, PLACED_PODS, POD, SIM, Harness

pytestmark = pytest.mark.timeout(20)


def quota(hard: str, used: str, resource: str = "requests.cpu", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "q", "uid": "uid-q"},
        "spec": {"hard": {resource: hard}, **spec},
        "status": {"hard": {resource: hard}, "used": {resource: used}},
    }


def limit_range(**cpu: str) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "Container"}
    for key, value in cpu.items():
        item[key] = {"cpu": value}
    return {"metadata": {"name": "lr", "uid": "uid-lr"}, "spec": {"limits": [item]}}


def staged(h: Harness) -> None:
    """Put a staged (never launched) simulation SIM into the backend, as staging leaves it."""
    spec = StageSpec(sim_id=SIM, case="pitzDaily", n_ranks=3, runs_root=h.case.parent)
    case = StagedCase(h.case, "pitzDaily", "tutorial", "simpleFoam", (1, 1, 1), 10)
    stage = _Stage(spec, threading.Thread(target=lambda: None), result=case, done=True)
    h.backend._stager._stages[SIM] = stage


def left(api: FakeKubeApi) -> list[tuple[str, str]]:
    return sorted(k for k in api.objects if k[0] in ("pods", "configmaps", "services"))


def test_a_create_refused_for_quota_halfway_deletes_what_was_made(tmp_path: Path) -> None:
    # the quota read before the create leaves room; by the create, another tenant took it
    api = FakeKubeApi(quota_millis=1000)
    api.objects[("resourcequotas", "q")] = quota("4", "0")
    h = Harness(tmp_path, api)
    staged(h)
    with pytest.raises(LaunchRefused) as refused:
        # group 0 (250m + 250m) created, group 1 (the 1500m rank) refused
        h.backend.launch(h.spec(rank_nodes=PLACED))
    assert refused.value.code is FailureCode.QUOTA_EXCEEDED
    assert "exceeded quota: q" in str(refused.value)
    assert [a for a in api.writes() if a[1] == "pods"][:2] == [
        ("create", "pods", PLACED_PODS[0]),
        ("create", "pods", PLACED_PODS[1]),
    ]
    assert ("delete", "configmaps", "rankpack-s1", "Foreground") in api.writes()
    assert left(api) == []  # no partial gang
    # nothing of it in the backend, and its case still staged (released: copy removed)
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.STAGED and obs.staged is not None
    h.backend.release(SIM)
    assert not h.case.exists()


def test_a_launch_the_quota_cannot_hold_is_refused_before_any_create(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.objects[("resourcequotas", "q")] = quota("2500m", "1")  # 1500m free, 2000m asked
    h = Harness(tmp_path, api)
    with pytest.raises(LaunchRefused) as refused:
        h.backend.launch(h.spec())
    assert refused.value.code is FailureCode.QUOTA_EXCEEDED
    assert "ResourceQuota q has 1500m of requests.cpu free" in str(refused.value)
    assert api.writes() == []


def test_a_quota_scoped_to_other_pods_is_not_counted(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.objects[("resourcequotas", "q")] = quota("1", "1", scopes=["BestEffort"])
    h = Harness(tmp_path, api)
    h.backend.launch(h.spec())
    assert left(api)


def test_limits_quota_without_limits_on_rank_pods_is_refused_for_good(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.objects[("resourcequotas", "q")] = quota("4", "0", resource="limits.cpu")
    h = Harness(tmp_path, api)
    with pytest.raises(LaunchFailed) as failed:
        h.backend.launch(h.spec())
    assert not isinstance(failed.value, LaunchRefused)
    assert failed.value.code is FailureCode.QUOTA_NEEDS_LIMITS
    assert api.writes() == []


def test_limits_quota_counts_the_limit_ranges_default_limit(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.objects[("resourcequotas", "q")] = quota("4", "2", resource="limits.cpu")
    api.objects[("limitranges", "lr")] = limit_range(default="2")  # 2 pods x 2 > 2 free
    h = Harness(tmp_path, api)
    ranks = (RankResources(250), RankResources(250), RankResources(1500))
    with pytest.raises(LaunchRefused, match=r"limits\.cpu free"):
        h.backend.launch(h.spec(ranks=ranks, rank_nodes=PLACED))


@pytest.mark.parametrize(
    ("cpu", "nodes", "why"),
    [
        pytest.param(
            {"min": "300m"}, ("n1", "n2", "n2"),
            "pod rankpack-s1-g0 (ranks 0): request 250m below the minimum of LimitRange lr",
            id="min-a-rank-alone",
        ),
        pytest.param(
            {"max": "1"}, PLACED,
            "pod rankpack-s1-g1 (ranks 2): request 1500m above the maximum of LimitRange lr",
            id="max",
        ),
        pytest.param(
            {"max": "1800m"}, (),
            "pod rankpack-s1-g0 (ranks 0-2): request 2000m above the maximum of LimitRange lr",
            id="max-the-groups-sum",  # (every rank within it: their pod is not)
        ),
        pytest.param(
            {"default": "1"}, PLACED,
            "pod rankpack-s1-g1 (ranks 2): request 1500m above its CPU limit 1000m",
            id="default-limit",
        ),
        pytest.param(
            {"maxLimitRequestRatio": "2"}, (),
            "pod rankpack-s1-g0 (ranks 0-2): no CPU limit, which LimitRange lr",
            id="ratio",
        ),
    ],
)  # fmt: skip
def test_a_rank_outside_the_limit_range_is_refused_before_any_create(
    tmp_path: Path, cpu: dict[str, str], nodes: tuple[str, ...], why: str
) -> None:
    api = FakeKubeApi()
    api.objects[("limitranges", "lr")] = limit_range(**cpu)
    h = Harness(tmp_path, api)
    with pytest.raises(LaunchFailed) as failed:
        h.backend.launch(h.spec(rank_nodes=nodes))
    assert failed.value.code is FailureCode.OUTSIDE_LIMIT_RANGE
    assert why in str(failed.value)
    assert api.writes() == []


def test_a_create_the_limit_ranger_refuses_is_outside_limit_range(tmp_path: Path) -> None:
    def limit_ranger(kind: str, body: dict[str, Any]) -> None:
        if kind == "pods" and body["metadata"]["name"] == PLACED_PODS[1]:
            raise ApiError(403, "Forbidden", f'pods "{PLACED_PODS[1]}" is forbidden: minimum '
                           "cpu usage per Container is 2, but request is 1500m")  # fmt: skip

    api = FakeKubeApi(admit=limit_ranger)
    h = Harness(tmp_path, api)
    with pytest.raises(LaunchFailed) as failed:
        h.backend.launch(h.spec(rank_nodes=PLACED))  # the second pod refused
    assert failed.value.code is FailureCode.OUTSIDE_LIMIT_RANGE
    assert left(api) == []


def test_inventory_carries_the_quotas_and_the_rank_bounds(tmp_path: Path) -> None:
    api = FakeKubeApi(forbid_nodes=True)
    api.objects[("resourcequotas", "q")] = quota("1200m", "500m")
    api.objects[("resourcequotas", "l")] = {
        **quota("3", "1", resource="limits.cpu"),
        "metadata": {"name": "l", "uid": "u"},
    }
    api.objects[("limitranges", "lr")] = limit_range(min="100m", max="2", default="1500m")
    h = Harness(tmp_path, api)
    from dataclasses import replace

    h.backend.config = replace(h.backend.config, allocatable_millis=2000)
    inv = h.backend.inventory()
    assert inv.quota is not None and (inv.quota.hard_millis, inv.quota.used_millis) == (1200, 500)
    assert inv.limits_quota is not None and inv.limits_quota.resource == "limits.cpu"
    assert inv.rank_bounds is not None
    assert (inv.rank_bounds.min_millis, inv.rank_bounds.max_millis) == (100, 1500)
    assert inv.rank_bounds.default_limit_millis == 1500


def test_limit_ranges_not_readable_are_learned_and_not_asked_again(tmp_path: Path) -> None:
    api = FakeKubeApi(forbid_paths={"/api/v1/namespaces/rankpack/limitranges"})
    h = Harness(tmp_path, api)
    h.backend.launch(h.spec())
    h.backend.launch(h.spec(sim_id="s2"))
    h.backend.inventory()
    assert [a for a in api.actions if a[1] == "limitranges"] == [("list", "limitranges")]


def test_a_grow_the_quota_refuses_is_rejected_with_the_quota_code(tmp_path: Path) -> None:
    api = FakeKubeApi(quota_millis=2100)
    h = Harness(tmp_path, api)
    h.backend.launch(h.spec())
    h.run_all()
    # +250m: the group pod's 2000m to 2250m, past the 2100m quota
    st = h.backend.resize(SIM, 0, RankResources(500))
    assert st.state is ResizeState.REJECTED and st.code is FailureCode.QUOTA_EXCEEDED
    assert ("create", "events", POD, "QuotaExceeded") in api.actions
    assert h.backend.resize(SIM, 0, RankResources(300)).state is not ResizeState.REJECTED


def test_in_pod_mode_the_launcher_pod_counts_against_the_quota_and_limit_range(
    tmp_path: Path,
) -> None:
    from rankpack.backend.kubernetes.api.config import KubernetesConfig
    from rankpack.backend.kubernetes.api.informer import Cache
    from rankpack.backend.kubernetes.nodes.capacity import ClusterCapacity
    from rankpack.backend.kubernetes.record import SimRecord
    from rankpack.backend.kubernetes.starting.podmode import options_of

    api = FakeKubeApi()
    api.objects[("resourcequotas", "q")] = quota("1", "0")
    config = KubernetesConfig(kubeconfig=Path("/k"), namespace="rankpack", launcher="pod",
                              launcher_cpu_millis=50)  # fmt: skip
    # two group pods: the quota's 1000m, and 2 x 50m more (the launcher's two containers)
    pods = [("pod a", RankResources(500)), ("pod b", RankResources(500))]
    check = ClusterCapacity(api, config, Cache(api, background=False)).launch_check(pods)
    assert check.refusal is not None and check.refusal[0] is FailureCode.QUOTA_EXCEEDED
    assert "need 1100m" in check.refusal[1]
    # a LimitRange min above the launcher's request raises it (and counts it so)
    api.objects[("resourcequotas", "q")] = quota("2", "0")
    api.objects[("limitranges", "lr")] = limit_range(min="100m")
    check = ClusterCapacity(api, config, Cache(api, background=False)).launch_check(pods)
    assert check.refusal is None and check.launcher_millis == 100
    h = Harness(tmp_path)
    sim = SimRecord(spec=h.spec(), image="i", volume=None, desired=[], groups=(), in_pod=True)  # type: ignore[arg-type]
    assert (opts := options_of(sim, config, "rankpack")) is not None and opts.cpu_millis == 50
    sim.launcher_millis = check.launcher_millis
    assert (opts := options_of(sim, config, "rankpack")) is not None and opts.cpu_millis == 100
