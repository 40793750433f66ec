"""`rankpack operator` under faults, on the dev cluster: kube-apiserver stopped and started
again mid-run; a resize the node defers (another tenant's pod holds the CPU); rank pods
deleted and evicted mid-run.

Each test runs the operator as its own process with the least-privilege ServiceAccount and
checks the outcome from the cluster (Simulations, their Events, pods) and from the
operator's SQLite store (one run per simulation).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rankpack.devcluster.lifecycle import restarts
from tests.k8s.operators import Env, endless_pitzdaily
from tests.k8s.pods import tenant_pod

LONG = 2000
"""Iterations of the two simulations of the pod-fault test."""


def _submit(env: Env, *flags: str) -> list[str]:
    case = str(endless_pitzdaily(env.tmp))
    made = env.cli("submit", case, "--backend", "kubernetes", "--ranks", "2", "--json",
                   *flags)  # fmt: skip
    assert made.returncode == 0, made.stderr
    names: list[str] = json.loads(made.stdout)["simulations"]
    return names


def _iterations(env: Env, name: str) -> int:
    return int(env.status(name).get("iterations") or 0)


def test_apiserver_stopped_and_restarted_mid_run(env: Env, tmp_path: Path) -> None:
    names = _submit(env, "--iterations", "1500", "--count", "2", "--budget", "1")
    log = tmp_path / "op.log"
    op = env.operator("--until-idle", log=log)
    env.wait("a simulation making progress",
             lambda: any(_iterations(env, n) >= 20 for n in names), 420)  # fmt: skip
    running = [n for n in names if env.status(n).get("phase") == "Running"]
    # Down for longer than the Lease's renew deadline (10 s): the operator's term ends, the
    # simulations run on without it; when the apiserver is back it takes the Lease again
    # and adopts them from the cluster's state.
    before = {n: env.status(n)["simId"] for n in running}
    t0 = time.monotonic()
    assert restarts.stop_component(env.k8s.state_dir, "kube-apiserver")
    time.sleep(25)
    restarts.start_component(env.k8s.state_dir, "kube-apiserver", timeout_s=180)
    down_s = time.monotonic() - t0
    assert op.wait(timeout=900) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "lost the lease" in text and "leading (term 2)" in text, text[-4000:]
    sims = env.simulations()
    assert [o["status"]["phase"] for o in sims] == ["Succeeded"] * 2, text[-4000:]
    for o in sims:
        st = o["status"]
        assert st["restarts"] == 0 and st["iterations"] == 1500, st
        assert st["result"]["status"] == "completed"
        assert Path(st["runDir"], "log.simpleFoam").stat().st_size > 0  # the log survived
    for name in running:  # running through the outage: followed again, not relaunched
        assert env.status(name)["simId"] == before[name]
        assert f"adopted {name}" in text
    runs = env.runs()  # exactly one run per simulation, each completed: nothing lost or doubled
    assert sorted(r[2] for r in runs) == sorted(o["status"]["simId"] for o in sims), runs
    assert [r[1] for r in runs] == ["completed"] * 2, runs
    assert not env.rank_pods()
    print(f"apiserver down {down_s:.1f} s; operator log tail:\n{text[-1500:]}")


def _hog(env: Env, millis: int) -> Any:
    """Another tenant's pod, in a namespace the operator's identity cannot see (a context:
    it yields what deletes it)."""
    from kubernetes import client

    return tenant_pod(client.CoreV1Api(env.k8s.admin_api()), "rankpack-test-hog", millis)


def test_a_launch_the_scheduler_cannot_place_is_rolled_back_and_runs_later(
    env: Env, tmp_path: Path
) -> None:
    """Issue 40: another tenant's pod (which the operator cannot see) leaves no room for
    the Simulation's pod: within a minute its launch is rolled back (no pod left) and it
    waits Queued, reason Unschedulable with the scheduler's words; it is Starting, never
    Running, while its pod is pending; once the room is back it runs to the end."""
    with _hog(env, 1500) as free:
        # 2 x 500m in one pod: 1000m, with the hog's 1500m more than the node's 2000m
        (name,) = _submit(env, "--iterations", "200", "--phases", "0:500,500")
        log = tmp_path / "op.log"
        op = env.operator("--until-idle", log=log)
        phases: list[str] = []
        pending_since: float | None = None

        def rolled_back() -> bool:
            nonlocal pending_since
            st = env.status(name)
            phases.append(str(st.get("phase")))
            if env.rank_pods() and pending_since is None:
                pending_since = time.monotonic()
            return st.get("phase") == "Queued" and st.get("reason") == "Unschedulable"

        env.wait("the launch rolled back", rolled_back, 300)
        took = time.monotonic() - (pending_since or time.monotonic())
        st = env.status(name)
        print(f"\nrolled back {took:.0f} s after its pod was made: {st.get('message')}")
        assert took < 60, took
        assert "Insufficient cpu" in st["message"] and "rolled back" in st["message"], st
        assert "Running" not in phases and "Starting" in phases, phases  # never Running
        env.wait("its pods gone", lambda: not env.rank_pods(), 60)
        free()
        assert op.wait(timeout=600) == 0, log.read_text()[-4000:]
    st = env.status(name)
    assert st["phase"] == "Succeeded" and st["iterations"] == 200, st
    runs = env.runs()
    assert [r[1] for r in runs] == ["requeued", "completed"], runs
    reasons = [e.reason for e in env.events(name)]
    assert reasons.count("Launched") == 2 and reasons.count("Succeeded") == 1, reasons


def test_a_deferred_resize_is_followed_not_counted_and_applied_later(
    env: Env, tmp_path: Path
) -> None:
    with _hog(env, 900) as free:
        # 2 x 500m + 900m fit the node's 2000m; the phase at 10 % asks 2 x 1000m: the node
        # has 100m free (the operator cannot see the hog), so the kubelet defers both. The
        # run must outlast the deferral's way into the status (coalesced to a patch per
        # 10 s), the Event, 5 s and the hog's deletion: 1 500 iterations (23 s here) ended
        # before the hog was gone in a CI run, so both resizes stayed deferred to the end
        # (4 000: ~60 s on a quiet machine, ~30 s of it after the hog is gone).
        (name,) = _submit(env, "--iterations", "4000",
                          "--phases", "0:500,500;0.1:1000,1000")  # fmt: skip
        log = tmp_path / "op.log"
        op = env.operator("--until-idle", log=log)

        def deferred() -> bool:
            st = env.status(name)
            conds = {c["type"]: c for c in st.get("conditions") or []}
            return conds.get("ResizeDeferred", {}).get("status") == "True"

        env.wait("a deferred resize in the status", deferred, 420)
        st = env.status(name)
        assert st["resizes"] == 0, st  # deferred is not done
        states = [(r.get("resize") or {}).get("state") for r in st["ranks"]]
        assert "deferred" in states, st
        env.wait("the ResizeDeferred Event", lambda: "ResizeDeferred" in [
            e.reason for e in env.events(name)], 30)  # fmt: skip
        time.sleep(5)  # still deferred a while later: the node keeps it, nothing counted
        assert env.status(name)["resizes"] == 0
        print(f"\nhog deleted at iteration {env.status(name).get('iterations')} of 4000")
        free()
        assert op.wait(timeout=900) == 0, log.read_text()[-4000:]
    st = env.status(name)
    assert st["phase"] == "Succeeded" and st["restarts"] == 0, st
    assert st["resizes"] == 2, st  # both applied once the CPU was free, each counted once
    assert [r["requestMillis"] for r in st["ranks"]] == [1000, 1000]
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds["ResizeDeferred"] == "False", st
    reasons = [e.reason for e in env.events(name)]
    assert "ResizeDeferred" in reasons and reasons.count("Resized") == 2, reasons
    (run,) = env.runs()
    assert run[1] == "completed"
    print(f"events on {name}: {reasons}")


def test_rank_pods_deleted_and_evicted_fail_only_their_simulations(
    env: Env, tmp_path: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(env.k8s.admin_api())
    ns = env.k8s.namespace
    # The faults need the two side by side: no launch gate (two 2-rank simulations that
    # keep their cores busy are no gain to the model, which held the second until the first
    # ended in a CI run), and polite waits so that both progress on 2 cores.
    names = _submit(env, "--iterations", str(LONG), "--count", "2", "--phases", "0:300,300",
                    "--wait", "polite")  # fmt: skip
    log = tmp_path / "op.log"
    op = env.operator("--until-idle", "--gate", "off", log=log)  # at most two at once

    def progressing() -> list[str]:
        return [n for n in names if env.status(n).get("phase") == "Running"
                and _iterations(env, n) >= 5]  # fmt: skip

    env.wait("two simulations making progress", lambda: len(progressing()) == 2, 420)
    deleted, spared = progressing()
    # The third, submitted now, is launched when the first fails and must still run when
    # this test looks for its pod: a process in the root cgroup can be starved for tens of
    # seconds while rank pods run (CI once saw a third of 1 500 iterations start and finish
    # unseen). It is evicted once its solver writes its log, so its length costs nothing.
    names += _submit(env, "--iterations", "100000", "--phases", "0:300,300")
    pod_a = f"rankpack-{env.status(deleted)['simId']}-g0"  # (its ranks' one pod)
    core.delete_namespaced_pod(pod_a, ns)
    env.wait("the one whose pod was deleted to fail",
             lambda: env.status(deleted).get("phase") == "Failed", 120)  # fmt: skip
    (evicted,) = [n for n in names if n not in (deleted, spared)]

    def third_pod_running() -> str | None:
        # Read from the cluster, not from the operator's status: on this kernel a process in
        # the root cgroup (the operator, this test) can be starved for tens of seconds while
        # rank pods run (docs/kubernetes.md), so the status may skip "Running" altogether.
        sim_id = env.status(evicted).get("simId")
        pod = next((p for p in env.rank_pods()
                    if p.metadata.name == f"rankpack-{sim_id}-g0"), None)  # fmt: skip
        return pod.metadata.name if pod is not None and pod.status.phase == "Running" else None

    def third_solving() -> bool:
        # its solver has written to its log (evicted earlier, there would be no log to keep)
        run_dir = env.status(evicted).get("runDir")
        log = Path(run_dir, "log.simpleFoam") if run_dir else None
        return log is not None and log.exists() and "Time =" in log.read_text(errors="replace")

    env.wait("the third's rank pod to run", lambda: third_pod_running() is not None, 300)
    env.wait("the third's solver to write its log", third_solving, 300)
    pod_c = f"rankpack-{env.status(evicted)['simId']}-g0"
    core.create_namespaced_pod_eviction(
        pod_c, ns, client.V1Eviction(metadata=client.V1ObjectMeta(name=pod_c, namespace=ns))
    )
    env.wait("the one whose pod was evicted to fail",
             lambda: env.status(evicted).get("phase") == "Failed", 120)  # fmt: skip
    assert env.status(spared)["phase"] == "Running"  # untouched by both
    assert op.wait(timeout=900) == 0, log.read_text()[-4000:]
    for name, pod in ((deleted, pod_a), (evicted, pod_c)):
        st = env.status(name)
        (failed,) = [c for c in st["conditions"] if c["type"] == "Failed"]
        assert failed["status"] == "True" and pod in failed["message"], failed
        assert st["result"]["status"] == "failed" and pod in st["result"]["message"]
        assert pod in st["message"], st
        assert Path(st["runDir"], "log.simpleFoam").stat().st_size > 0  # case and log survive
    st = env.status(spared)
    assert st["phase"] == "Succeeded" and st["restarts"] == 0 and st["iterations"] == LONG, st
    assert sorted(r[1] for r in env.runs()) == ["completed", "failed", "failed"]
    assert not env.rank_pods()  # every simulation's pods are gone
    # each says why with its failure code: the status's reason, its condition's, its Event's
    for name, code in ((deleted, "PodDeleted"), (evicted, "Evicted")):
        st = env.status(name)
        (failed,) = [c for c in st["conditions"] if c["type"] == "Failed"]
        assert st["reason"] == failed["reason"] == st["result"]["reason"] == code, st
        assert code in [e.reason for e in env.events(name)]


def test_operator_sigkilled_mid_launch_is_adopted_and_launched_once(
    env: Env, tmp_path: Path
) -> None:
    import signal

    (name,) = _submit(env, "--iterations", "300")
    first = env.operator(log=tmp_path / "first.log")
    # killed as soon as the launch is recorded (sim id in the status): its rank pods are
    # being created, mpirun has not been started yet
    env.wait("the launch to be recorded", lambda: bool(env.status(name).get("simId")), 300)
    first.send_signal(signal.SIGKILL)
    first.wait()
    sim_id = env.status(name)["simId"]
    assert not env.launchers(), "mpirun was started before the kill; the test needs a faster kill"
    second = env.operator("--until-idle", log=tmp_path / "second.log")
    assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]
    st = env.status(name)
    assert st["phase"] == "Succeeded" and st["simId"] == sim_id, st
    assert st["iterations"] == 300 and st["restarts"] == 0
    assert f"adopted {name}" in (tmp_path / "second.log").read_text()
    runs = env.runs()
    assert [(r[1], r[2]) for r in runs] == [("completed", sim_id)], runs  # one run, one mpirun
    assert (Path(st["runDir"]) / ".rankpack" / "mpirun.launch").exists()
