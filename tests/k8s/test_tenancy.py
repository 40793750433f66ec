"""One operator, two namespaces (issue 26, item 7), as a cluster admin deploys it:
``kubectl apply -k deploy/dev-tenants`` (``deploy/dev`` with a Role and RoleBinding per
served namespace: the operator never creates one) runs the operator serving ``team-a`` and
``team-b``.

Two users, ServiceAccounts that may only create, get, list and delete Simulations in their
own namespace, each submit a Simulation of the same name. Both Succeed; each user is
Forbidden the other's Simulations (get, list, create, delete) and pods; a case path under
the other namespace's case root is refused at create; each Simulation's rank pods (and its
launcher pod) ran in its own namespace, as ``rankpack-rank``, on its namespace's claim; each
run directory lies in its namespace's part of the volume, and its Events in its namespace.
Meanwhile a hostile case of ``team-a`` stages without end (the scanner off: its own staging
pod is what holds it): both plain Simulations are launched before it fails at its deadline
(issue 39: of the same namespace and of another).

The fixture removes the tenants, their volumes and the operator's Deployment and DaemonSet
afterwards (the next in-cluster test deploys ``deploy/dev`` again).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.objects.rbac import RANK_SERVICE_ACCOUNT
from rankpack.devcluster import deploy
from rankpack.devcluster.binaries import DEFAULT_VERSION, KubeVersion, bin_dir
from rankpack.devcluster.layout import NAMESPACE, Layout
from rankpack.errors import UserError
from rankpack.operator import crd, manifests, tenant_manifests
from tests.k8s import hostile
from tests.k8s.conftest import DevCluster
from tests.k8s.kubeconfigs import token_kubeconfig
from tests.k8s.waits import until

A, B = tenant_manifests.EXAMPLE
ITERATIONS = 30
"""Short: pitzDaily on two rank pods each, both namespaces on the 2-core node (the solver
runs about 2 s; starting the ranks through the launcher pod takes most of a run)."""
SIMS = f"simulations.{crd.GROUP}"
USER = "simulation-user"


@dataclass
class Tenants:
    k8s: DevCluster
    layout: Layout
    version: KubeVersion
    users: dict[str, Path]
    """namespace -> a kubeconfig of that namespace's user (its own token)."""

    def kubectl(self, *args: str, timeout_s: float = 60) -> str:
        return deploy.kubectl(self.layout, self.version, [*args], timeout_s)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def as_user(self, ns: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(bin_dir(self.version) / "kubectl"), f"--kubeconfig={self.users[ns]}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.get(SIMS, name, "-n", ns).get("status") or {})

    def wait(self, what: str, cond: Any, timeout_s: float) -> None:
        until(what, cond, timeout_s)


def _remove_tenants(t: Tenants) -> None:
    for kind, name in (("deployment", manifests.NAME), ("daemonset", "rankpack-node-agent")):
        t.kubectl("delete", kind, name, "-n", manifests.SYSTEM_NAMESPACE, "--ignore-not-found",
                  "--wait=true", timeout_s=120)  # fmt: skip
    t.kubectl("delete", "namespace", A, B, "--ignore-not-found", "--wait=true", timeout_s=300)
    t.kubectl("delete", "pv", *(f"rankpack-dev-runs-{ns}" for ns in (A, B)),
              "--ignore-not-found")  # fmt: skip
    # its admission policy too: a later test's Simulation of a case in /tmp is no user's
    t.kubectl("delete", "validatingadmissionpolicy,validatingadmissionpolicybinding", "-l",
              "app.kubernetes.io/managed-by=rankpack", "--ignore-not-found")  # fmt: skip


def _user(t: Tenants, ns: str, tmp: Path) -> Path:
    """A ServiceAccount of ``ns`` that may only create, get, list and delete Simulations
    there, and a kubeconfig holding its token."""
    t.kubectl("create", "serviceaccount", USER, "-n", ns)
    t.kubectl("create", "role", USER, "-n", ns, "--verb=create,get,list,delete",
              f"--resource={SIMS}")  # fmt: skip
    t.kubectl("create", "rolebinding", USER, "-n", ns, f"--role={USER}",
              f"--serviceaccount={ns}:{USER}")  # fmt: skip
    token = t.kubectl("create", "token", USER, "-n", ns, "--duration=1h").strip()
    return token_kubeconfig(t.layout.admin_kubeconfig, token, ns, tmp / f"user-{ns}.kubeconfig")


@pytest.fixture(scope="module")
def tenants(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    dev_cluster.ensure_up()
    layout, version = Layout(dev_cluster.state_dir), KubeVersion.parse(DEFAULT_VERSION)
    t = Tenants(dev_cluster, layout, version, {})
    # what an interrupted earlier run may have left (a PersistentVolume bound to a claim
    # of a namespace that is gone would never bind again)
    t.kubectl("delete", "namespace", A, B, "--ignore-not-found", "--wait=true", timeout_s=300)
    t.kubectl("delete", "pv", *(f"rankpack-dev-runs-{ns}" for ns in (A, B)), "--ignore-not-found")
    done = deploy.deploy(layout, version, 300, overlay="dev-tenants")
    print(f"deploy/dev-tenants applied and rolled out in {done.elapsed_s:.0f} s")
    t.kubectl("patch", "deployment", manifests.NAME, "-n", manifests.SYSTEM_NAMESPACE,
              "--type=json", "-p",
              json.dumps([{"op": "add", "path": "/spec/template/spec/containers/0/command/-",
                           "value": flag} for flag in hostile.SANDBOX_FLAGS]))  # fmt: skip
    deploy.wait_rolled_out(layout, version, ["deployments"], 300)
    try:
        tmp = tmp_path_factory.mktemp("tenants")
        t.users = {ns: _user(t, ns, tmp) for ns in (A, B)}
        yield t
    finally:
        try:
            print(t.kubectl("logs", "-n", manifests.SYSTEM_NAMESPACE,
                            f"deployment/{manifests.NAME}", "--tail=30",
                            "--timestamps"))  # fmt: skip
        except UserError as exc:
            print(f"no operator log: {exc}")
        _remove_tenants(t)


def _simulation_json(name: str, path: str = "pitzDaily") -> str:
    # fixed sizes small enough for both at once: the second is launched as soon as the
    # first runs (nothing to profile), so the two namespaces' pods run side by side
    spec = {"case": {"path": path}, "ranks": 2, "iterations": ITERATIONS, "budgetMillis": 500,
            "sizing": "fixed"}  # fmt: skip
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
            "spec": spec}  # fmt: skip
    return json.dumps(body)


def _create(t: Tenants, user_ns: str, ns: str, body: str) -> subprocess.CompletedProcess[str]:
    argv = [str(bin_dir(t.version) / "kubectl"), f"--kubeconfig={t.users[user_ns]}",
            "create", "-n", ns, "-f", "-"]  # fmt: skip
    return subprocess.run(argv, input=body, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def _forbidden(done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode != 0 and "forbidden" in done.stderr.lower()


def _sleeper(t: Tenants) -> str:
    """A Simulation of team-a whose staging never ends, its staging pod running."""
    # the namespace's part of the volume as the admin gives it: its user's (the pods'),
    # where the operator makes the runs directory next to the cases (made as root here, the
    # operator's run directory was refused: 'Permission denied')
    cases = Path(manifests.DEV_RUNS_DIR) / "namespaces" / A / "cases"
    for d in (cases.parent, cases):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, manifests.RUN_AS, manifests.RUN_AS)
    case = hostile.sleeping_case(cases)
    hostile.give_to_pods(case, manifests.RUN_AS)
    path = f"{manifests.RUNS_PATH}/namespaces/{A}/cases/{case.name}"
    done = _create(t, A, A, _simulation_json("sleeper", path))
    assert done.returncode == 0, done.stderr

    def staging() -> bool:
        pods = t.get("pods", "-n", A, "-l", "rankpack.dev/role=staging")["items"]
        return any(p["status"].get("phase") == "Running" for p in pods)

    try:
        t.wait("the sleeper's staging pod to run", staging, 180)
    except AssertionError:
        print(t.kubectl("get", SIMS + ",pods,events", "-n", A, "-o", "wide"))
        print(json.dumps(t.status(A, "sleeper"), indent=1))
        raise
    return "sleeper"


def test_two_namespaces_two_users_each_sees_and_reaches_only_its_own(tenants: Tenants) -> None:
    t = tenants
    sleeper = _sleeper(t)
    started = time.monotonic()
    name = "pitz"  # the same name in both namespaces
    for ns in (A, B):
        done = _create(t, ns, ns, _simulation_json(name))
        assert done.returncode == 0, done.stderr
    # neither user reaches the other's namespace: Simulations or pods; nor its own pods
    for me, other in ((A, B), (B, A)):
        for args in (("get", SIMS, name, "-n", other), ("get", SIMS, "-n", other),
                     ("delete", SIMS, name, "-n", other), ("get", "pods", "-n", other),
                     ("get", "pods", "-n", me)):  # fmt: skip
            done = t.as_user(me, *args)
            assert _forbidden(done), (me, args, done.returncode, done.stdout, done.stderr)
        done = _create(t, me, other, _simulation_json("intruder"))
        assert _forbidden(done), (me, done.stderr)
        assert t.as_user(me, "get", SIMS, name, "-n", me).returncode == 0
    # a case under the other namespace's case root is refused at create (the admission
    # policy's roots are each namespace's own), as text: nothing is read
    theirs = f"{manifests.RUNS_PATH}/namespaces/{B}/cases/pitz"
    done = _create(t, A, A, _simulation_json("theirs", theirs))
    assert done.returncode != 0 and "CasePathNotAllowed" in done.stderr, done.stderr

    # while they run: every rank and launcher pod in its Simulation's namespace
    seen: dict[str, set[str]] = {A: set(), B: set()}
    accounts: set[str] = set()
    claims: set[tuple[str, str]] = set()
    together = 0  # looks that found both namespaces' rank pods at once

    def look() -> bool:
        nonlocal together
        pods = t.get("pods", "-A", "-l", "rankpack.dev/sim")["items"]
        ranks_in = {p["metadata"]["namespace"] for p in pods
                    if "rankpack.dev/group" in p["metadata"]["labels"]}  # fmt: skip
        together += ranks_in >= {A, B}
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            seen.setdefault(meta["namespace"], set()).add(meta["labels"]["rankpack.dev/sim"])
            if "rankpack.dev/group" in meta["labels"]:
                accounts.add(spec.get("serviceAccountName", "default"))
            claims.update((meta["namespace"], v["persistentVolumeClaim"]["claimName"])
                          for v in spec["volumes"] if "persistentVolumeClaim" in v)  # fmt: skip
        return all(t.status(ns, name).get("phase") in ("Succeeded", "Failed") for ns in (A, B))

    t.wait("both Simulations to end", look, 600)
    statuses = {ns: t.status(ns, name) for ns in (A, B)}
    elapsed = time.monotonic() - started
    for ns, st in statuses.items():
        print(f"{ns}/{name}: {st.get('phase')} {st.get('iterations')} iterations, run "
              f"{st.get('runDir')}, {st.get('reason', '')} {st.get('message', '')}")  # fmt: skip
    print(f"both ended {elapsed:.0f} s after they were created; both namespaces' rank pods "
          f"seen at once in {together} looks")  # fmt: skip
    sims = {ns: st.get("simId") for ns, st in statuses.items()}
    for ns, st in statuses.items():
        assert st["phase"] == "Succeeded" and st["iterations"] == ITERATIONS, st
        assert sims[ns] in seen[ns], (ns, seen)  # its pods were seen, in its namespace
        other = B if ns == A else A
        assert sims[ns] not in seen[other] and sims[ns] not in seen.get(NAMESPACE, set())
        # its run directory: in its namespace's part of the volume (the operator's view, and
        # on this host behind that namespace's PersistentVolume)
        root = Path(manifests.RUNS_PATH) / "namespaces" / ns / "runs"
        run_dir = Path(st["runDir"])
        assert run_dir.parent == root, run_dir
        on_host = Path(manifests.DEV_RUNS_DIR) / run_dir.relative_to(manifests.RUNS_PATH)
        assert (on_host / "system" / "controlDict").is_file(), on_host
        events = t.get(
            "events",
            "-n",
            ns,
            "--field-selector",
            f"involvedObject.kind={crd.KIND},involvedObject.name={name}",
        )["items"]
        reasons = [e["reason"] for e in events]
        assert reasons.count("Launched") == 1 and reasons.count("Succeeded") == 1, reasons
        claim = t.get("pvc", manifests.RUNS_CLAIM, "-n", ns)
        assert claim["spec"]["volumeName"] == f"rankpack-dev-runs-{ns}", claim["spec"]
    assert accounts == {RANK_SERVICE_ACCOUNT}, accounts
    assert claims <= {(A, manifests.RUNS_CLAIM), (B, manifests.RUNS_CLAIM)}, claims
    assert statuses[A]["runDir"] != statuses[B]["runDir"]
    # the hostile staging held nothing of either namespace: both were launched before it
    # failed at its deadline, with its code
    t.wait("the sleeper to fail", lambda: t.status(A, sleeper).get("phase") == "Failed",
           hostile.STAGING_DEADLINE_S + 240)  # fmt: skip
    slept = t.status(A, sleeper)
    assert slept["result"]["reason"] == "StageFailed" and "deadline" in slept["result"]["message"]
    failed = hostile.condition_time(slept, "Failed")
    for ns in (A, B):
        about = f"involvedObject.kind={crd.KIND},involvedObject.name={name}"
        events = t.get("events", "-n", ns, "--field-selector", about)["items"]
        launched = hostile.event_time(events, "Launched")
        assert launched is not None and failed is not None and launched < failed, (ns, slept)
