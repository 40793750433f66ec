"""`rankpack operator` on the dev cluster: Simulations multiplexed to completion, an operator
SIGKILLed mid-run and restarted (every simulation runs exactly once), two operators at once.

The operator runs as its own process (the CLI, as a user starts it) with the least-privilege
ServiceAccount; the test reads the Simulations as the admin, as `kubectl get` would.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.k8s.operators import Env, endless_pitzdaily


def test_three_simulations_multiplexed_to_completion(env: Env, tmp_path: Path) -> None:
    made = env.cli("submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2",
                   "--iterations", "200", "--count", "3", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    names = json.loads(made.stdout)["simulations"]
    assert len(names) == 3
    op = env.operator("--until-idle", "--json", log=tmp_path / "op.log")
    assert op.wait(timeout=600) == 0, (tmp_path / "op.log").read_text()[-3000:]
    sims = env.simulations()
    assert sorted(o["metadata"]["name"] for o in sims) == sorted(names)
    for o in sims:
        st = o["status"]
        assert st["phase"] == "Succeeded", st
        assert st["restarts"] == 0 and st["iterations"] == 200
        # sized in place to the measured duty cycles - or started at the sizes learned
        # from a copy profiled before (controller/learned.py): counted below
        assert st["result"]["status"] == "completed"
    assert sum(o["status"]["resizes"] for o in sims) >= 1, [o["status"] for o in sims]
    runs = env.runs()
    assert [r[1] for r in runs] == ["completed"] * 3
    listed = env.cli("simulations", "--json")
    assert [s["status"]["phase"] for s in json.loads(listed.stdout)] == ["Succeeded"] * 3


def test_sigkilled_operator_is_restarted_and_adopts_its_simulations(
    env: Env, tmp_path: Path
) -> None:
    # without its residualControl: the tutorial converges near iteration 285 (~10 s), and
    # the second copy waits for the first to be profiled, so the first could end before
    # the kill with nothing left running to adopt
    case = str(endless_pitzdaily(env.tmp))
    made = env.cli("submit", case, "--backend", "kubernetes", "--ranks", "2",
                   "--iterations", "800", "--count", "2", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr

    def progressing() -> bool:
        sims = env.simulations()
        return any(int((o.get("status") or {}).get("iterations") or 0) >= 20 for o in sims)

    first = env.operator(log=tmp_path / "first.log")
    env.wait("a simulation making progress", progressing, 300)
    first.send_signal(signal.SIGKILL)
    first.wait()
    # claimed by the killed operator: Starting (staged or launched, its ranks not all
    # running yet) or Running
    running = [o for o in env.simulations() if o["status"].get("phase") in ("Starting", "Running")]
    assert running, env.phases()
    launched = {o["metadata"]["name"]: o["status"].get("simId") for o in running}
    second = env.operator("--until-idle", log=tmp_path / "second.log")
    assert second.wait(timeout=900) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    sims = env.simulations()
    assert [o["status"]["phase"] for o in sims] == ["Succeeded"] * 2, log[-3000:]
    for o in sims:
        name = o["metadata"]["name"]
        if launched.get(name):
            assert f"adopted {name}" in log
            assert o["status"]["simId"] == launched[name]  # the same simulation, not a relaunch
        assert o["status"]["restarts"] == 0
    # exactly one run per simulation, each completed: nothing launched twice or lost
    runs = env.runs()
    assert len(runs) == 2 and len({r[2] for r in runs}) == 2, runs
    assert [r[1] for r in runs] == ["completed"] * 2, runs


def test_only_the_lease_holder_acts(env: Env, tmp_path: Path) -> None:
    made = env.cli("submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2",
                   "--iterations", "100", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    leader = env.operator("--identity", "leader", "--until-idle", log=tmp_path / "leader.log")
    env.wait("the leader to claim", lambda: env.phases() != ["Queued"] and env.phases() != ["-"],
             120)  # fmt: skip
    follower = env.operator("--identity", "follower", log=tmp_path / "follower.log")
    assert leader.wait(timeout=300) == 0, (tmp_path / "leader.log").read_text()[-3000:]
    # a leader that stops cleanly gives its Lease up (else the follower would wait for it
    # to expire): right after its exit the Lease is free, or the follower's already
    holder = _lease_holder(env)
    assert holder in (None, "follower"), holder
    env.wait("the follower to lead", lambda: "follower: leading" in
             (tmp_path / "follower.log").read_text(), 60)  # fmt: skip
    (o,) = env.simulations()
    assert o["status"]["phase"] == "Succeeded" and o["status"]["operator"] == "leader"
    text = (tmp_path / "follower.log").read_text()
    assert "waiting for the lease" in text
    follower.send_signal(signal.SIGTERM)
    follower.wait(timeout=60)


def _lease_holder(env: Env) -> str | None:
    from kubernetes import client

    coord = client.CoordinationV1Api(env.k8s.admin_api())
    lease = coord.read_namespaced_lease("rankpack-operator", env.k8s.namespace)
    return lease.spec.holder_identity if lease.spec is not None else None
