"""NamespacedBackends (issue 26, item 7): one Kubernetes backend per served namespace, behind
one backend. Against a FakeKubeApi per namespace: every object of a simulation is created,
changed and deleted in its own namespace only; the inventory counts every served namespace's
pods, plans with no one namespace's quota and within every namespace's LimitRange."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.kubernetes.tenants import NamespacedBackends, intersect
from rankpack.backend.protocol import BackendError, RankBounds, RankResources, UnknownSimulation
from rankpack.backend.worker import News
from tests.fakeapi import FakeKubeApi
from tests.unit.backend.kubernetes.test_backend import (
    PLACED,
    PLACED_PODS,
    POD,
    SIM,
    FakeReadings,
    Harness,
)
from tests.unit.backend.kubernetes.test_backend_quota import limit_range, quota

pytestmark = pytest.mark.timeout(20)

A, B = "team-a", "team-b"
NODE = {"metadata": {"name": "n1"}, "spec": {},
        "status": {"allocatable": {"cpu": "2"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def _pod(namespace: str, name: str, cpu: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


class TwoNamespaces:
    """Two namespaces' fake APIs and backends, and the one backend over both."""

    def __init__(self, tmp_path: Path, namespaces: tuple[str, ...] = (A, B)) -> None:
        self.h = Harness(tmp_path)  # its spec(), its case directory
        self.apis = {ns: FakeKubeApi(namespace=ns, nodes=[NODE], cluster_scope=False,
                                   forbid_paths={"/api/v1/pods"})
                     for ns in namespaces}  # fmt: skip
        self.news = News()
        backends = {}
        for ns, api in self.apis.items():
            config = KubernetesConfig(
                kubeconfig=Path("/k"), namespace=ns, release_timeout_s=2, agent_namespace=None,
                counted_namespaces=tuple(n for n in namespaces if n != ns),
            )  # fmt: skip
            backends[ns] = KubernetesBackend(
                api, config, source=FakeReadings(), starter=self.h.start,
                mpirun="/usr/bin/mpirun", background=False, news=self.news,
            )  # fmt: skip
        self.backend = NamespacedBackends(backends, self.news)

    def pods(self, ns: str) -> list[str]:
        return sorted(name for kind, name in self.apis[ns].objects if kind == "pods")


def test_a_simulation_lives_in_its_own_namespace_only(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.backend.launch(t.h.spec(namespace=B, rank_nodes=PLACED))
    assert t.pods(B) == PLACED_PODS and t.pods(A) == []
    assert t.apis[A].writes() == []
    for i, name in enumerate(PLACED_PODS):
        t.apis[B].run_pod(name, ip=f"10.201.0.{10 + i}")
    t.backend.backends[B].poll_once()
    assert t.backend.observe(SIM).sim_id == SIM
    t.backend.resize(SIM, 0, RankResources(300))
    assert ("patch", "pods/resize", PLACED_PODS[0]) in t.apis[B].actions
    t.backend.stop(SIM)
    t.backend.release(SIM)
    assert t.pods(B) == [] and t.apis[A].writes() == []
    with pytest.raises(UnknownSimulation):
        t.backend.observe(SIM)


def test_a_namespace_not_served_is_refused_and_a_simulation_never_moves(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    with pytest.raises(
        BackendError, match=r"namespace other is not served \(serving team-a, team-b"
    ):
        t.backend.launch(t.h.spec(namespace="other"))
    t.backend.launch(t.h.spec(namespace=A))
    with pytest.raises(BackendError, match=f"runs in {A}, not in {B}"):
        t.backend.adopt(SIM, t.h.spec(namespace=B))
    assert t.pods(B) == []


def test_without_a_namespace_a_simulation_goes_to_the_first(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.backend.launch(t.h.spec())
    assert t.pods(A) == [POD] and t.pods(B) == []


def test_the_listing_is_every_namespaces_and_discard_finds_its_namespace(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.backend.launch(t.h.spec(namespace=B))
    later = TwoNamespaces(tmp_path)  # another process: it knows nothing of SIM
    later.apis = t.apis
    for ns, backend in later.backend.backends.items():
        backend.api = t.apis[ns]
    assert [r.sim_id for r in later.backend.list()] == [SIM]
    later.backend.discard(SIM)
    assert ("delete", "configmaps", f"rankpack-{SIM}", "Foreground") in t.apis[B].actions
    assert not [a for a in t.apis[A].actions if a[0] == "delete"]


def test_the_inventory_counts_every_served_namespaces_pods(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.apis[A].other_pods = [_pod(B, "b-pod", "300m"), _pod("elsewhere", "x", "700m")]
    t.apis[A].objects[("pods", "a-pod")] = _pod(A, "a-pod", "200m")
    inv = t.backend.inventory()
    # its own and the other served namespace's; a namespace it does not serve it cannot see
    assert [(n.name, n.requested_millis) for n in inv.nodes] == [("n1", 500)]


def test_no_namespaces_quota_binds_the_others_but_every_limit_range_does(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.apis[A].objects[("resourcequotas", "q")] = quota("1", "0")
    t.apis[A].objects[("limitranges", "lr")] = limit_range(min="100m", max="1")
    t.apis[B].objects[("limitranges", "lr")] = limit_range(min="50m", max="600m")
    inv = t.backend.inventory()
    assert inv.quota is None and inv.limits_quota is None
    assert inv.rank_bounds is not None
    assert (inv.rank_bounds.min_millis, inv.rank_bounds.max_millis) == (100, 600)
    # serving one namespace, its quota is planned within as before
    one = TwoNamespaces(tmp_path, (A,))
    one.apis[A].objects[("resourcequotas", "q")] = quota("1", "0")
    found = one.backend.inventory().quota
    assert found is not None and found.hard_millis == 1000


def test_a_namespace_whose_limit_ranges_do_not_answer_keeps_its_last(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.apis[B].objects[("limitranges", "lr")] = limit_range(max="600m")
    assert t.backend.inventory().rank_bounds == t.backend.backends[B].rank_bounds()

    t.apis[B].fail_next["list"] = [ApiError(0, "", "connection refused")] * 10  # away
    bounds = t.backend.inventory().rank_bounds
    assert bounds is not None and bounds.max_millis == 600


def test_wait_wakes_on_any_namespaces_news(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    t.backend.backends[B].notify()  # e.g. its poller saw a rank pod run
    t.backend.wait(600.0)  # returns at once (else the test's timeout fails it)


def test_the_facts_name_every_namespace(tmp_path: Path) -> None:
    assert TwoNamespaces(tmp_path).backend.placement()["namespace"] == f"{A},{B}"


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        ([None, None], None),
        ([RankBounds(100, 500, source="a")], RankBounds(100, 500, source="a")),
        ([RankBounds(100, None, 800, "a"), RankBounds(50, 600, None, "b"), None],
         RankBounds(100, 600, 800, "a; b")),
        ([RankBounds(700, None), RankBounds(0, 600)], RankBounds(700, 600)),  # empty: no bound
    ],
)  # fmt: skip
def test_the_bounds_of_several_namespaces_are_their_intersection(
    bounds: list[RankBounds | None], expected: RankBounds | None
) -> None:
    found = intersect(bounds)
    assert found == expected
    if found is not None and bounds[0] is not None and bounds[0].min_millis == 700:
        assert found.empty


def test_rank_bounds_are_read_now(tmp_path: Path) -> None:
    t = TwoNamespaces(tmp_path)
    assert t.backend.backends[A].rank_bounds() is None
    t.apis[A].objects[("limitranges", "lr")] = limit_range(min="100m")
    found = t.backend.backends[A].rank_bounds()
    assert found is not None and replace(found, source="") == RankBounds(100)
