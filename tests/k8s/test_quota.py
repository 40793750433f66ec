"""A namespace ResourceQuota and LimitRange on the dev cluster (issue 26, item 5).

Before: under a 1200m ``requests.cpu`` quota, two queued 2-rank Simulations each got their
first rank pod, the second was refused and both ended Failed (LaunchFailed). Now the
operator plans within the quota (the second waits ``Queued`` with ``QuotaExceeded`` in its
status), and a create the apiserver refuses halfway (another tenant took the quota between
plan and create) leaves no partial gang and is requeued, never failed. The apiserver's own
refusals (exceeded quota, LimitRange, a limits.cpu quota on pods without limits) are
recognised as what they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes import launch
from rankpack.backend.kubernetes.api.config import load_config
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.kubernetes.connect import connect
from rankpack.backend.kubernetes.nodes.capacity import LaunchCheck
from rankpack.backend.kubernetes.objects.builders import SIM_LABEL
from rankpack.backend.kubernetes.objects.groups import RankGroup
from rankpack.backend.protocol import LaunchFailed, LaunchRefused, RankResources, SimSpec
from rankpack.core.failures import FailureCode
from rankpack.devcluster.nodefiles import with_node_files
from tests.k8s.conftest import DevCluster
from tests.k8s.operators import Env, endless_pitzdaily
from tests.k8s.pods import sleeper_pod, wait_running

RANKS = "rankpack.dev/ranks"
QUOTA = "rankpack-test-cpu"
LIMIT_RANGE = "rankpack-test-cpu"


def _quota(core: Any, ns: str, hard: dict[str, str]) -> None:
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": QUOTA}, "spec": {"hard": hard}})
    deadline = time.monotonic() + 30  # the quota controller fills its status
    while not (core.read_namespaced_resource_quota(QUOTA, ns).status.hard or {}):
        assert time.monotonic() < deadline, "the quota's status was never filled"
        time.sleep(0.2)


def _live_rank_pods(core: Any, ns: str) -> dict[str, int]:
    """Ranks in group pods not being deleted, per simulation id (a group pod's
    ``rankpack.dev/ranks`` annotation: ``0-1`` is two; a launcher pod has none)."""
    found: dict[str, int] = {}
    for pod in core.list_namespaced_pod(ns, label_selector=SIM_LABEL).items:
        ranks = (pod.metadata.annotations or {}).get(RANKS)
        if pod.metadata.deletion_timestamp is None and ranks is not None:
            sim = pod.metadata.labels[SIM_LABEL]
            first, _, last = ranks.partition("-")
            found[sim] = found.get(sim, 0) + int(last or first) - int(first) + 1
    return found


def test_two_simulations_under_a_quota_both_succeed_one_waiting_for_it(
    env: Env, tmp_path: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(env.k8s.admin_api())
    ns = env.k8s.namespace
    _quota(core, ns, {"requests.cpu": "1200m"})
    try:
        # 2 ranks of 500m each: one fits the quota, two do not. A phase schedule is never
        # packed into the room left (its requests are the user's), so the second must wait.
        # The first lasts well beyond the status's coalescing interval (10 s): pitzDaily
        # converges at iteration 285, 7.4 s on a quiet machine, before the second's
        # QuotaExceeded hold (coalesced after its first hold, Cooldown) was due.
        made = env.cli(
            "submit", str(endless_pitzdaily(env.tmp)), "--backend", "kubernetes",
            "--ranks", "2", "--budget", "1",
            "--iterations", "800", "--phases", "0:500,500", "--count", "2", "--json",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        op = env.operator("--until-idle", log=tmp_path / "op.log")
        waits: dict[str, str] = {}  # Simulation -> the QuotaExceeded message it showed
        phases: dict[str, set[str]] = {}
        partial_since: dict[str, float] = {}
        partial_longest = 0.0
        t0 = time.monotonic()
        while op.poll() is None:
            assert time.monotonic() - t0 < 600, (tmp_path / "op.log").read_text()[-3000:]
            for o in env.simulations():
                st = o.get("status") or {}
                name = o["metadata"]["name"]
                phases.setdefault(name, set()).add(st.get("phase", "-"))
                if st.get("phase") == "Queued" and st.get("reason") == "QuotaExceeded":
                    waits[name] = st.get("message", "")
            # never a partial gang: pods appear one by one during a create, but a
            # simulation holding 1 of its 2 ranks for long would be one
            now = time.monotonic()
            live = _live_rank_pods(core, ns)
            for sim, n in live.items():
                if n == 1:
                    partial_since.setdefault(sim, now)
                    partial_longest = max(partial_longest, now - partial_since[sim])
                else:
                    partial_since.pop(sim, None)
            for sim in [s for s in partial_since if s not in live]:
                partial_since.pop(sim)
            time.sleep(0.5)
        assert op.returncode == 0, (tmp_path / "op.log").read_text()[-3000:]
        sims = env.simulations()
        print(f"\nphases seen: {phases}\nQuotaExceeded while queued: {waits}\n"
              f"longest partial set of rank pods: {partial_longest:.1f} s")  # fmt: skip
        assert [o["status"]["phase"] for o in sims] == ["Succeeded", "Succeeded"], [
            o["status"].get("result") for o in sims
        ]
        assert not any("Failed" in seen for seen in phases.values())
        assert len(waits) == 1, waits  # the second waited, saying why
        assert "ResourceQuota rankpack-test-cpu (requests.cpu 1200m" in next(iter(waits.values()))
        assert partial_longest < 10.0
        assert _live_rank_pods(core, ns) == {}
        (waited,) = waits
        reasons = [e.reason for e in env.events(waited)]
        assert "QuotaExceeded" in reasons, reasons
        with sqlite3.connect(env.db) as conn:
            rows = conn.execute("SELECT kind, detail_json FROM events").fetchall()
            runs = [r[0] for r in conn.execute("SELECT status FROM runs").fetchall()]
        kinds = [k for k, _ in rows]
        assert "launch-failed" not in kinds
        assert runs.count("completed") == 2 and "failed" not in runs, runs
        held = [json.loads(d) for k, d in rows if k == "launch-held"]
        assert any(h.get("code") == "quota" for h in held), held
    finally:
        core.delete_namespaced_resource_quota(QUOTA, ns)


@pytest.fixture
def backend(k8s: DevCluster) -> Iterator[KubernetesBackend]:
    """The backend as the rankpack-backend ServiceAccount (it may not read nodes)."""
    config = load_config(k8s.up_result.service_account_kubeconfig, namespace=k8s.namespace)
    config = with_node_files(config, k8s.up_result.state_dir)
    b = connect(dataclasses.replace(config, allocatable_millis=2000))
    yield b
    b.close()


def _spec(sim_id: str, case: Path, *millis: int) -> SimSpec:
    case.mkdir(parents=True, exist_ok=True)
    return SimSpec(sim_id=sim_id, case_dir=case, command=("simpleFoam", "-parallel"),
                   ranks=tuple(RankResources(m) for m in millis),
                   log_path=case / "log.simpleFoam")  # fmt: skip


def _gone(core: Any, ns: str, sim_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while core.list_namespaced_pod(ns, label_selector=f"{SIM_LABEL}={sim_id}").items:
        assert time.monotonic() < deadline, f"rank pods of {sim_id} still exist"
        time.sleep(0.5)


def test_a_create_refused_halfway_leaves_no_partial_gang(
    k8s: DevCluster, backend: KubernetesBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(k8s.admin_api())
    ns = k8s.namespace
    _quota(core, ns, {"requests.cpu": "1200m"})
    try:
        core.create_namespaced_pod(ns, sleeper_pod("other-tenant", 700))  # 500m left
        wait_running(core, "other-tenant", ns)
        # the plan's read of the quota is stale: another tenant took it since
        checked = backend._capacity.launch_check
        backend._capacity.launch_check = lambda ranks: LaunchCheck(None, 50)  # type: ignore[method-assign]
        # two group pods (as on two nodes): the first is made, the second refused
        apart = (RankGroup(0, None, (0,)), RankGroup(1, None, (1,)))
        with pytest.raises(LaunchRefused) as refused, monkeypatch.context() as m:
            m.setattr(launch, "plan", lambda spec, capacity: apart)
            backend.launch(_spec("qrace1", tmp_path / "a", 400, 400))  # 400m made, 400m refused
        print(f"\nrefused: {refused.value}")
        assert refused.value.code is FailureCode.QUOTA_EXCEEDED
        assert "exceeded quota: rankpack-test-cpu" in str(refused.value)
        assert _live_rank_pods(core, ns).get("qrace1") is None  # gone or going, at once
        _gone(core, ns, "qrace1")
        # read now, the quota refuses the launch before anything is created
        backend._capacity.launch_check = checked  # type: ignore[method-assign]
        # (500m, or less while the quota's usage still counts qrace1's deleted pod)
        with pytest.raises(
            LaunchRefused, match=r"rankpack-test-cpu has \d+m of requests\.cpu free"
        ):
            backend.launch(_spec("qrace2", tmp_path / "b", 400, 400))
        assert not core.list_namespaced_pod(ns, label_selector=f"{SIM_LABEL}=qrace2").items
        # once the other tenant is gone, the same launch goes through
        core.delete_namespaced_pod("other-tenant", ns, grace_period_seconds=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                backend.launch(_spec("qrace3", tmp_path / "c", 400, 400))
                break
            except LaunchRefused:
                assert time.monotonic() < deadline, "the quota never had room again"
                time.sleep(1)
        assert _live_rank_pods(core, ns) == {"qrace3": 2}
        backend.release("qrace3")
        _gone(core, ns, "qrace3")
    finally:
        core.delete_namespaced_resource_quota(QUOTA, ns)
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod("other-tenant", ns)


def test_the_apiservers_limit_range_and_limits_quota_refusals_fail_with_their_codes(
    k8s: DevCluster, backend: KubernetesBackend, tmp_path: Path
) -> None:
    """What the apiserver says (not the backend's own check, bypassed here): a rank below a
    LimitRange's min is OutsideLimitRange, a limits.cpu quota with rank pods that set no
    limit QuotaNeedsLimits; nothing of either launch is left."""
    from kubernetes import client

    core = client.CoreV1Api(k8s.admin_api())
    ns = k8s.namespace
    backend._capacity.launch_check = lambda ranks: LaunchCheck(None, 50)  # type: ignore[method-assign]
    lr = {"metadata": {"name": LIMIT_RANGE},
          "spec": {"limits": [{"type": "Container", "min": {"cpu": "100m"}}]}}  # fmt: skip
    core.create_namespaced_limit_range(ns, lr)
    try:
        with pytest.raises(LaunchFailed) as failed:
            backend.launch(_spec("qlr1", tmp_path / "a", 60, 30))  # a pod of 90m
        print(f"\nLimitRange: {failed.value}")
        assert failed.value.code is FailureCode.OUTSIDE_LIMIT_RANGE
        _gone(core, ns, "qlr1")
    finally:
        core.delete_namespaced_limit_range(LIMIT_RANGE, ns)
    _quota(core, ns, {"limits.cpu": "4"})
    try:
        with pytest.raises(LaunchFailed) as failed:
            backend.launch(_spec("qlim1", tmp_path / "b", 200, 200))
        print(f"limits.cpu quota: {failed.value}")
        assert failed.value.code is FailureCode.QUOTA_NEEDS_LIMITS
        _gone(core, ns, "qlim1")
    finally:
        core.delete_namespaced_resource_quota(QUOTA, ns)
