"""rankpack as a cluster runs it (issue 27): `dev-cluster up --operator` builds the images,
applies ``deploy/dev``, and the operator (a Deployment) and the node agent (a DaemonSet) run
from them. Two Simulations created with `kubectl create` end Succeeded exactly once, with a
duty cycle for every rank, in-place resizes and no restart, across a forced delete of the
operator's pod and of the agent's pod mid-run; no pod of ours mounts a host path but the
agent; no live record lives on the case volume; the agent answers 401 without a token, 403
to a Simulation creator and 200 to the operator.

The namespace is labelled PodSecurity ``enforce=restricted`` for the module (deploy/dev
relaxes it for the dev image's rank pods, which mount this host's /usr), so every rank and
launcher pod the operator creates is admitted under ``restricted``. The fixture removes the
Deployment and the DaemonSet afterwards (not the namespace: the other k8s tests use it), so
no in-cluster operator competes for the Lease with the operators the other tests start.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from rankpack.devcluster import deploy
from rankpack.devcluster.binaries import DEFAULT_VERSION, KubeVersion
from rankpack.devcluster.layout import NAMESPACE, Layout
from rankpack.errors import UserError
from rankpack.operator import crd, manifests
from tests.browser import DASHBOARD_CHECKS, Browser, session
from tests.cli_runner import rankpack
from tests.dashboard_script import dashboard_process
from tests.k8s import hostile
from tests.k8s.conftest import DevCluster
from tests.k8s.kubeconfigs import token_kubeconfig
from tests.k8s.operators import endless_pitzdaily
from tests.k8s.waits import until

AGENT = "rankpack-node-agent"
AGENT_PORT = 8475
CREATOR = "simulation-creator"
ITERATIONS = {"incluster-a": 10000, "incluster-b": 400}
"""The first is long (about 4 minutes here; two ranks in one group pod spin through 4000
iterations in 96 s): the operator that replaces a deleted one
starts leading about 100 s later on this busy 2-core node (its Python starts beside two
spinning ranks with a 100m request), and it must still measure duty cycles and make the
phase change at 75 % after that: the faults come while it runs. The second runs while an
operator leads (before it, beside it or after it, as the launch gate decides)."""
ENFORCE = "pod-security.kubernetes.io/enforce"
IN_POD = Path(manifests.tenant_path(NAMESPACE))
"""The users' namespace's part of the storage, as its pods (and the operator) name it."""
ADMISSION_KINDS = "validatingadmissionpolicy,validatingadmissionpolicybinding"
OTHER_NAMESPACE = f"{NAMESPACE}-elsewhere"
"""A namespace no operator serves, holding a Simulation `_reader` may not read."""
MANAGED = "app.kubernetes.io/managed-by=rankpack"


@dataclass
class InCluster:
    k8s: DevCluster
    layout: Layout
    version: KubeVersion
    deployed: deploy.Deployed

    def kubectl(self, *args: str, timeout_s: float = 60) -> str:
        return deploy.kubectl(self.layout, self.version, [*args], timeout_s)

    def get(self, *args: str, namespace: str = NAMESPACE) -> Any:
        return json.loads(self.kubectl("get", "-n", namespace, *args, "-o", "json"))

    def pods(self, selector: str, namespace: str = NAMESPACE) -> list[Any]:
        return list(self.get("pods", "-l", selector, namespace=namespace)["items"])

    def agents(self) -> list[Any]:
        return self.pods(f"app.kubernetes.io/name={AGENT}", manifests.SYSTEM_NAMESPACE)

    def operator_pods(self) -> list[Any]:
        """The operator's pods, in its own namespace (rankpack's, not the users'), but those
        on their way out (a rollout replaces them one at a time)."""
        pods = self.pods(f"app.kubernetes.io/name={manifests.NAME}", manifests.SYSTEM_NAMESPACE)
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def leader(self, timeout_s: float = 120) -> Any:
        """The operator's pod that holds the Lease (its identity is its pod's name), once
        one does."""
        found: list[Any] = []

        def holder() -> bool:
            lease = self.get("lease", manifests.NAME, namespace=manifests.SYSTEM_NAMESPACE)
            name = (lease.get("spec") or {}).get("holderIdentity")
            found[:] = [p for p in self.operator_pods() if p["metadata"]["name"] == name]
            return bool(found)

        self.wait("an operator to lead", holder, timeout_s)
        return found[0]

    def open_files(self, pod: Any) -> str:
        """What the operator's process (pid 1 of its container) holds open."""
        return self.kubectl("exec", "-n", manifests.SYSTEM_NAMESPACE, pod["metadata"]["name"],
                            "--", "ls", "-l", "/proc/1/fd")  # fmt: skip

    @property
    def tenant(self) -> Path:
        """The users' namespace's part of the storage on this host (`IN_POD` in its pods)."""
        return self.deployed.runs_dir / "namespaces" / NAMESPACE

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"simulations.{crd.GROUP}", name).get("status") or {})

    def wait(self, what: str, cond: Any, timeout_s: float) -> None:
        until(what, cond, timeout_s)

    def delete_simulations(self, *names: str) -> None:
        for name in names:
            self.kubectl("delete", f"simulations.{crd.GROUP}", name, "-n", NAMESPACE,
                         "--ignore-not-found")  # fmt: skip

    def simulation_events(self, name: str) -> list[Any]:
        """The Events of the Simulation ``name`` now, by its uid: an earlier test's
        Simulation of that name has Events too (kept for an hour)."""
        uid = self.get(f"simulations.{crd.GROUP}", name)["metadata"]["uid"]
        return list(json.loads(self.kubectl(
            "get", "events", "-n", NAMESPACE, "-o", "json", "--field-selector",
            f"involvedObject.kind=Simulation,involvedObject.uid={uid}"))["items"])  # fmt: skip

    def print_operator_log(self, tail: int) -> None:
        print(self.kubectl("logs", "-n", manifests.SYSTEM_NAMESPACE, "-l",
                           f"app.kubernetes.io/name={manifests.NAME}", "--prefix",
                           f"--tail={tail}", "--timestamps"))  # fmt: skip

    def token(self, service_account: str, namespace: str = NAMESPACE) -> str:
        return self.kubectl("create", "token", service_account, "-n", namespace,
                            "--duration=1h").strip()  # fmt: skip


def _remove_operator(ic: InCluster) -> None:
    for kind, name in (("deployment", manifests.NAME), ("daemonset", AGENT)):
        ic.kubectl("delete", kind, name, "-n", manifests.SYSTEM_NAMESPACE, "--ignore-not-found",
                   "--wait=true", timeout_s=120)  # fmt: skip
    # its admission policy too: a later test's Simulation of a case in /tmp is no user's
    ic.kubectl("delete", ADMISSION_KINDS, "-l", MANAGED, "--ignore-not-found")
    ic.wait(
        "the operator's and agent's pods to go",
        lambda: (
            not ic.pods(
                f"app.kubernetes.io/name in ({manifests.NAME},{AGENT})", manifests.SYSTEM_NAMESPACE
            )
        ),
        120,
    )


@pytest.fixture(scope="module")
def incluster(dev_cluster: DevCluster) -> Iterator[InCluster]:
    k8s = dev_cluster
    k8s.ensure_up()
    layout, version = Layout(k8s.state_dir), KubeVersion.parse(DEFAULT_VERSION)
    done = deploy.deploy(layout, version, 300)
    ic = InCluster(k8s, layout, version, done)
    # deploy/dev admits the dev image's /usr host mount in the namespace; the operator's
    # pods (rank and launcher pods of the real image) must pass `restricted` as on a cluster
    ic.kubectl("label", "namespace", NAMESPACE, f"{ENFORCE}=restricted", "--overwrite")
    # the sandbox, not the scanner, is tested: scan off, and a deadline a test can wait for
    ic.kubectl("patch", "deployment", manifests.NAME, "-n", manifests.SYSTEM_NAMESPACE,
               "--type=json", "-p",
               json.dumps([{"op": "add", "path": "/spec/template/spec/containers/0/command/-",
                            "value": flag} for flag in hostile.SANDBOX_FLAGS]))  # fmt: skip
    try:
        deploy.wait_rolled_out(layout, version, ["deployments"], 300)
        yield ic
    finally:
        ic.kubectl("label", "namespace", NAMESPACE, f"{ENFORCE}=privileged", "--overwrite")
        _remove_operator(ic)


def test_the_operator_and_the_agent_run_from_deploy(incluster: InCluster) -> None:
    ic = incluster
    ops = ic.operator_pods()  # in its own namespace, none of the users'
    assert len(ops) == manifests.REPLICAS == 2, [p["metadata"]["name"] for p in ops]
    assert not ic.pods(f"app.kubernetes.io/name={manifests.NAME}")
    for op in ops:
        spec = op["spec"]
        assert all("hostPath" not in v for v in spec["volumes"]), spec["volumes"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        (container,) = spec["containers"]
        assert container["image"] == manifests.DEV_IMAGES[manifests.RANK_IMAGE]
    # one leads and has the store open; the standby has not opened it (the leader writes it)
    leader = ic.leader()
    (standby,) = [p for p in ops if p["metadata"]["name"] != leader["metadata"]["name"]]
    store = Path(manifests.STORE).name
    ic.wait("the leader to open its store", lambda: store in ic.open_files(leader), 60)
    assert store not in ic.open_files(standby)
    agents = ic.agents()
    nodes = ic.get("nodes")["items"]
    assert len(agents) == len(nodes)
    assert {a["spec"]["nodeName"] for a in agents} == {n["metadata"]["name"] for n in nodes}
    for image in ic.deployed.images.images:
        print(f"image {image.ref}: {image.unpacked_bytes / 1e6:.0f} MB unpacked")


def _agent_get(ip: str, token: str | None) -> int:
    req = urllib.request.Request(f"http://{ip}:{AGENT_PORT}/v1/ranks?namespace={NAMESPACE}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            json.load(response)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_agent_answers_401_403_200(incluster: InCluster) -> None:
    ic = incluster
    (agent, *_) = ic.agents()
    ip = agent["status"]["podIP"]
    ic.kubectl("create", "serviceaccount", CREATOR, "-n", NAMESPACE)
    try:
        ic.kubectl("create", "role", CREATOR, "-n", NAMESPACE, "--verb=create,get,list,delete",
                   f"--resource=simulations.{crd.GROUP}")  # fmt: skip
        ic.kubectl("create", "rolebinding", CREATOR, "-n", NAMESPACE, f"--role={CREATOR}",
                   f"--serviceaccount={NAMESPACE}:{CREATOR}")  # fmt: skip
        assert _agent_get(ip, None) == 401
        assert _agent_get(ip, "not-a-token") == 401
        assert _agent_get(ip, ic.token(CREATOR)) == 403
        assert _agent_get(ip, ic.token(manifests.NAME, manifests.SYSTEM_NAMESPACE)) == 200
    finally:
        for kind in ("rolebinding", "role", "serviceaccount"):
            ic.kubectl("delete", kind, CREATOR, "-n", NAMESPACE, "--ignore-not-found")


def _phased_simulation(name: str, case: str) -> dict[str, Any]:
    iterations = ITERATIONS[name]
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name},
        "spec": {
            "case": {"path": case},
            "ranks": 2,
            "iterations": iterations,
            # a phase change late in the run: every Simulation is resized in place at least
            # once, also the one whose operator was deleted early in its run
            "phases": [
                {"startFraction": 0.0, "requestMillis": [250, 500]},
                {"startFraction": 0.75, "requestMillis": [500, 250]},
            ],
        },
    }


def _running(ic: InCluster, name: str) -> bool:
    st = ic.status(name)
    done = int(st.get("iterations") or 0)
    return st.get("phase") == "Running" and 20 < done < ITERATIONS[name] / 2


def test_two_simulations_survive_the_operator_and_the_agent_being_deleted(
    incluster: InCluster, tmp_path: Path
) -> None:
    ic = incluster
    runs = ic.deployed.runs_dir
    in_pod = _endless_case(ic)
    names = sorted(ITERATIONS)
    ic.delete_simulations(*names)
    manifest = runs / "simulations.json"
    items = [_phased_simulation(n, in_pod) for n in names]
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
    try:
        # the two run side by side or one after the other, as the operator's launch gate
        # decides; the faults come while the long one runs (the short one, ~20 s, may end
        # before a replaced operator leads: it would see no phase change)
        ic.wait("the long Simulation running", lambda: _running(ic, "incluster-a"), 420)
        ranks = ic.pods("rankpack.dev/group")  # a pod per simulation on the one node
        assert len(ranks) in (1, 2), [p["metadata"]["name"] for p in ranks]
        for pod in ranks:  # no host path; the restricted security context
            spec = pod["spec"]
            assert all("hostPath" not in v for v in spec["volumes"]), spec["volumes"]
            (c,) = spec["containers"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, c
            assert (spec.get("securityContext") or {}).get("runAsNonRoot") or c[
                "securityContext"].get("runAsNonRoot"), spec  # fmt: skip
        # the agent first: its pod deleted, a new one serves the node again, and the
        # running Simulation's duty cycles are measured again
        (agent, *_) = ic.agents()
        ic.kubectl("delete", "pod", agent["metadata"]["name"], "-n", manifests.SYSTEM_NAMESPACE,
                   "--force", "--grace-period=0")  # fmt: skip

        def agent_back() -> bool:
            return any(a["metadata"]["name"] != agent["metadata"]["name"] and any(
                c.get("ready") for c in a["status"].get("containerStatuses") or [])
                for a in ic.agents())  # fmt: skip

        ic.wait("a new agent serving the node", agent_back, 300)
        # issue 42: what a glance shows of the running one, in its status and columns

        def glanced() -> bool:
            st = ic.status("incluster-a")
            return st.get("phase") != "Running" or {"eta", "duty", "efficiency", "nodes"} <= set(st)

        ic.wait("ETA, duty, efficiency and nodes in the running one's status", glanced, 120)
        st = ic.status("incluster-a")
        if st.get("phase") == "Running":
            shown = ic.kubectl("get", f"simulations.{crd.GROUP}", "-n", NAMESPACE, "incluster-a")
            wide = ic.kubectl("get", f"simulations.{crd.GROUP}", "-n", NAMESPACE, "incluster-a",
                              "-o", "wide")  # fmt: skip
            print(f"\n{shown}\n{wide}")
            assert shown.split()[5:11] == ["ITER", "ETA", "DUTY", "EFF", "NODES", "AGE"], shown
            assert st["eta"] in shown and st["nodes"] in shown, (st, shown)
            assert 0 < st["duty"]["min"] <= st["duty"]["mean"] <= 1 and st["efficiency"] > 0, st
            assert {"PROGRESS", "MINDUTY", "RESIZES", "RESTARTS", "WAIT", "RUN"} <= set(
                wide.splitlines()[0].split()), wide  # fmt: skip
            # rankpack top and rankpack dashboard (its page in headless Chromium), as a user
            # who may only read Simulations here, while a Simulation of another namespace
            # exists: each twice, 10 s apart
            reader = _reader(ic, runs)
            elsewhere = _elsewhere(ic)
            try:
                with dashboard_process(reader) as (url, proc), session() as page:
                    page.open(url)
                    drawn = _in_step_with_the_status(page)
                    first = _top(reader)
                    time.sleep(max(0.0, drawn + 6 - time.monotonic()))
                    seen = [json.loads(page.evaluate(DASHBOARD_CHECKS))]
                    (tmp_path / "dashboard-1.png").write_bytes(page.screenshot())
                    time.sleep(10)
                    seen.append(json.loads(page.evaluate(DASHBOARD_CHECKS)))
                    (tmp_path / "dashboard-2.png").write_bytes(page.screenshot())
                    second = _top(reader)
                    errors, data = page.errors, _dashboard_data(url)
            finally:
                ic.kubectl("delete", "namespace", OTHER_NAMESPACE, "--ignore-not-found",
                           "--wait=false")  # fmt: skip
            assert proc.returncode == 0, proc.returncode  # stopped by SIGINT, cleanly
            _assert_dashboard(seen, errors, data, elsewhere)
            print(f"dashboard screenshots: {tmp_path}")
            assert first["nodes"] is None and second["nodes"] is None  # may not read nodes
            a1, a2 = (next(s for s in v["simulations"] if s["name"] == "incluster-a")
                      for v in (first, second))  # fmt: skip
            print(
                f"top, 10 s apart: {a1['progress']} -> {a2['progress']}, duty per rank "
                f"{[r['duty'] for r in a1['ranks']]} -> {[r['duty'] for r in a2['ranks']]}"
            )
            if a2["phase"] == "Running":
                assert a2["iterations"] > a1["iterations"], (a1, a2)
                assert all(r["duty"] is not None and r["node"] for r in a2["ranks"]), a2
        # then the leading operator: the standby (or a replacement) adopts what runs
        op = ic.leader()
        ic.kubectl("delete", "pod", op["metadata"]["name"], "-n", manifests.SYSTEM_NAMESPACE,
                   "--force", "--grace-period=0")  # fmt: skip

        def adopted() -> bool:
            pods = ic.operator_pods()
            new = [p["metadata"]["name"] for p in pods
                   if p["metadata"]["name"] != op["metadata"]["name"]
                   and p["status"].get("phase") == "Running"]  # fmt: skip
            for name in new:
                try:
                    if "adopted " in ic.kubectl("logs", "-n", manifests.SYSTEM_NAMESPACE, name):
                        return True
                except UserError:  # its container is still starting
                    continue
            return False

        ic.wait("the next operator to adopt the running Simulation", adopted, 420)
        ic.wait("both Simulations to end",
                lambda: all(ic.status(n).get("phase") in ("Succeeded", "Failed") for n in names),
                900)  # fmt: skip
        for name in names:
            st = ic.status(name)
            print(f"{name}: {json.dumps(st)[:1500]}")
            assert st["phase"] == "Succeeded", st
            assert st["iterations"] == ITERATIONS[name] and st["restarts"] == 0, st
            assert st["resizes"] >= 1, st
            assert all(r.get("duty") is not None for r in st["ranks"]), st["ranks"]
            assert st.get("usage") == "node-agent", st
            run_dir = runs / Path(st["runDir"]).relative_to(manifests.RUNS_PATH)
            # the shim's live records lived in the rank pods' own volumes, not on the case's
            assert not list(run_dir.rglob("rank-*.rec")), list(run_dir.rglob("rank-*.rec"))
            # run exactly once: one launch, one end
            reasons = [e["reason"] for e in ic.simulation_events(name)]
            assert reasons.count("Launched") == 1 and reasons.count("Succeeded") == 1, reasons
    finally:
        ic.print_operator_log(40)
        ic.delete_simulations(*names)


def _reader(ic: InCluster, tmp: Path) -> Path:
    """A kubeconfig of a ServiceAccount that may only get and list Simulations in
    `NAMESPACE` (issue 42: ``rankpack top`` with a user's own rights)."""
    name, sims = "sim-reader", f"simulations.{crd.GROUP}"
    for args in (
        ("serviceaccount", name),
        ("role", name, "--verb=get,list", f"--resource={sims}"),
        ("rolebinding", name, f"--role={name}", f"--serviceaccount={NAMESPACE}:{name}"),
    ):
        try:
            ic.kubectl("create", *args, "-n", NAMESPACE)
        except UserError as exc:
            if "AlreadyExists" not in str(exc):
                raise
    return token_kubeconfig(ic.layout.admin_kubeconfig, ic.token(name), NAMESPACE,
                            tmp / "sim-reader.kubeconfig")  # fmt: skip


def _top(kubeconfig: Path) -> Any:
    done = rankpack("top", "--once", "--json", "--kubeconfig", str(kubeconfig), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _elsewhere(ic: InCluster) -> str:
    """A Simulation in another namespace, `OTHER_NAMESPACE` (no operator serves it), that
    an admin sees and `_reader` may not read; its name."""
    name = "elsewhere"
    manifest = ic.deployed.runs_dir / "elsewhere.json"
    manifest.write_text(json.dumps({
        "apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
        "spec": {"case": {"path": "pitzDaily"}, "ranks": 2, "iterations": 30},
    }))  # fmt: skip
    for args in (["namespace", OTHER_NAMESPACE], ["-n", OTHER_NAMESPACE, "-f", str(manifest)]):
        try:
            ic.kubectl("create", *args)
        except UserError as exc:
            if "AlreadyExists" not in str(exc):
                raise
    found = ic.get(f"simulations.{crd.GROUP}", name, namespace=OTHER_NAMESPACE)
    assert found["metadata"]["namespace"] == OTHER_NAMESPACE  # there, to be not seen
    return name


POINTS_A = """(() => {
  const s = document.querySelector('section.sim[data-sim="incluster-a"]');
  return s ? Number(s.dataset.residualPoints) : 0; })()"""


def _in_step_with_the_status(page: Browser) -> float:
    """When (`time.monotonic`) the page drew a status write just made (a new residual
    point). The operator writes one every 10-12 s and the page shows it within about 2 s
    (the dashboard reads every second, the page asks every second): the next one shows 8
    to 14 s after this, inside two screenshots taken 6 and 16 s after it, 10 s apart."""
    page.wait_for(f"{POINTS_A} >= 1", 60)
    before = page.evaluate(POINTS_A)
    page.wait_for(f"{POINTS_A} > {before}", 30)
    return time.monotonic()


def _dashboard_data(url: str) -> Any:
    with urllib.request.urlopen(f"{url}api/view", timeout=30) as r:
        return json.load(r)


def _assert_dashboard(seen: list[Any], errors: list[Any], data: Any, elsewhere: str) -> None:
    """The page 10 s apart (`tests.browser.DASHBOARD_CHECKS`): the running Simulation's
    residual curve and duty heat map grew; no console error; nothing of the other
    namespace, on the page or in its data."""
    a1, a2 = ([s for s in v["sims"] if s["name"] == "incluster-a"] for v in seen)
    print(f"dashboard, 10 s apart: {a1} -> {a2}")
    assert errors == [], errors
    for v in seen:
        assert "incluster-a" in v["rows"], v["rows"]
        assert {s["namespace"] for s in v["sims"]} <= {NAMESPACE}, v["sims"]
        assert elsewhere not in v["rows"] and OTHER_NAMESPACE not in v["text"], v["text"]
        assert "may not read nodes" in v["text"]
    text = json.dumps(data)
    assert OTHER_NAMESPACE not in text and f'"{elsewhere}"' not in text
    assert data["nodes"] is None and data["namespace"] == NAMESPACE
    assert a1, seen[0]["sims"]
    if a2 and a2[0]["phase"] == "Running":
        assert a2[0]["points"] > a1[0]["points"] >= 1, (a1, a2)
        assert a2[0]["columns"] > a1[0]["columns"] >= 1, (a1, a2)


def test_a_deleted_launcher_pod_fails_its_simulation_with_a_code(incluster: InCluster) -> None:
    """mpirun's pod gone: the Simulation ends Failed, reason LauncherLost, within a bound;
    never a hang (its rank pods cannot go on without their mpirun)."""
    ic = incluster
    name = "incluster-launcher"
    ic.delete_simulations(name)
    manifest = ic.deployed.runs_dir / "launcher-lost.json"
    # a run that lasts (the tutorial's 285 iterations may end on a quiet machine before the
    # status, coalesced to one patch per 10 s, shows it running)
    body = _phased_simulation("incluster-a", str(IN_POD / "cases" / "pitzDailyLong"))
    body["metadata"]["name"] = name
    body["spec"]["iterations"] = 3000
    manifest.write_text(json.dumps(body))
    endless_pitzdaily(ic.tenant / "cases")  # (made by an earlier test, or now)
    ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
    try:
        ic.wait("it running", lambda: int(ic.status(name).get("iterations") or 0) > 5, 300)
        sim_id = ic.status(name)["simId"]
        ic.kubectl("delete", "pod", f"rankpack-{sim_id}-launcher", "-n", NAMESPACE, "--force",
                   "--grace-period=0")  # fmt: skip
        deleted = time.monotonic()
        ic.wait("it to fail", lambda: ic.status(name).get("phase") in ("Failed", "Succeeded"),
                120)  # fmt: skip
        st = ic.status(name)
        print(f"{name}: ended {time.monotonic() - deleted:.1f} s after its launcher pod was "
              f"deleted: {st.get('reason')}: {st.get('message')}")  # fmt: skip
        assert st["phase"] == "Failed" and st["reason"] == "LauncherLost", st
        assert f"rankpack-{sim_id}-launcher" in st["message"], st
        ic.wait("its rank pods to go", lambda: not ic.pods(f"rankpack.dev/sim={sim_id}"), 120)
    finally:
        ic.delete_simulations(name)


def test_no_resize_is_decided_while_the_agent_is_away(incluster: InCluster) -> None:
    """The node agent unreachable for longer than a profiling window (its DaemonSet kept off
    the node), while the Simulation's phase change falls due: no resize is decided on stale
    data until the agent is back (a NodeAgentUnreachable Event says why), then the change
    is made while the run goes on. (The rest of the run is not waited for: that a run ends
    Succeeded after its agent came back is `test_two_simulations_survive_...`.)"""
    ic = incluster
    # long enough that the phase change (at 30 %) falls due well after the agent is gone on a
    # quiet machine too (~100 iterations a second there; the status's iterations lag by up to
    # its 10 s coalescing)
    name, total = "incluster-away", 10000
    ic.delete_simulations(name)
    body = _phased_simulation("incluster-a", str(IN_POD / "cases" / "pitzDailyLong"))
    body["metadata"]["name"] = name
    body["spec"]["iterations"] = total
    body["spec"]["phases"][1]["startFraction"] = 0.3  # due while the agent is away
    manifest = ic.deployed.runs_dir / "agent-away.json"
    manifest.write_text(json.dumps(body))
    endless_pitzdaily(ic.tenant / "cases")  # (made by an earlier test, or now)
    ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
    ds = ["daemonset", AGENT, "-n", manifests.SYSTEM_NAMESPACE]
    away = '{"spec":{"template":{"spec":{"nodeSelector":{"rankpack.dev/no-such-node":"x"}}}}}'
    back = '{"spec":{"template":{"spec":{"nodeSelector":null}}}}'

    def done() -> int:
        return int(ic.status(name).get("iterations") or 0)

    def resizes_requested(run_id: object) -> list[float]:
        """When the operator decided each resize of the run (its store, on the volume)."""
        if run_id is None:
            return []
        # read-only, while the operator writes it (WAL: readers do not block it)
        db = sqlite3.connect(f"file:{ic.deployed.runs_dir / 'operator.db'}?mode=ro", uri=True,
                             timeout=30)  # fmt: skip
        try:
            rows = db.execute(
                "SELECT at FROM events WHERE run_id = ? AND kind = 'resize-requested'", (run_id,)
            ).fetchall()
        finally:
            db.close()
        return [datetime.fromisoformat(at).timestamp() for (at,) in rows]

    try:
        ic.wait("it running", lambda: done() >= 0.05 * total, 300)
        ic.kubectl("patch", *ds, "-p", away)
        ic.wait("the agent gone", lambda: not ic.agents(), 60)
        gone, gone_at = time.time(), done()
        # (else the phase change fell due while the agent was still there: nothing to judge)
        assert gone_at < 0.3 * total, f"the agent went only at iteration {gone_at} of {total}"
        ic.wait("its phase change to fall due", lambda: done() >= 0.4 * total, 300)
        restored = time.time()
        ic.kubectl("patch", *ds, "-p", back)

        def resized_after() -> bool:
            # the phase change made (the status counts completed resizes), or the run over
            st = ic.status(name)
            if st.get("phase") in ("Succeeded", "Failed"):
                return True
            return int(st.get("resizes") or 0) >= 1 and any(
                t >= restored - 1.0 for t in resizes_requested(st.get("runId")))  # fmt: skip

        ic.wait("a resize after the agent is back, or its end", resized_after, 600)
        st = ic.status(name)
        assert st["phase"] in ("Running", "Succeeded") and st["resizes"] >= 1, st
        events = json.loads(ic.kubectl("get", "events", "-n", NAMESPACE, "-o", "json"))["items"]
        away_events = [e for e in events if e["reason"] == "NodeAgentUnreachable"
                       and st["simId"] in e["involvedObject"]["name"]]  # fmt: skip
        print(f"{name}: NodeAgentUnreachable events: {[e['message'] for e in away_events]}")
        assert away_events, "no NodeAgentUnreachable Event on the Simulation's rank pods"
        assert all(e["involvedObject"]["namespace"] == NAMESPACE for e in away_events)
        # the operator's own record (its store is on the volume): every resize it decided
        # for this run came after the agent was back
        times = resizes_requested(st["runId"])
        # none while the agent was away (a profiling resize before it went is allowed), and
        # the phase change after it was back
        during = [t for t in times if gone + 1.0 <= t < restored - 1.0]
        assert not during, (during, gone, restored)
        after = [t for t in times if t >= restored - 1.0]
        assert after, (times, restored)
        print(
            f"{name}: agent away at iteration {gone_at}; resizes before it went: "
            f"{len(times) - len(after)}; first after it was back: {min(after) - restored:.1f} s"
        )
    finally:
        ic.kubectl("patch", *ds, "-p", back)
        ic.delete_simulations(name)


def _simulation(name: str, case: str, iterations: int) -> dict[str, Any]:
    return {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
            "spec": {"case": {"path": case}, "ranks": 2, "iterations": iterations}}  # fmt: skip


def _can_i(ic: InCluster, verb: str, account: str) -> str:
    """Whether ``account`` of the namespace may ``verb`` pods/exec (``pods/exec`` as one
    word would ask about a pod named exec)."""
    who = f"--as=system:serviceaccount:{NAMESPACE}:{account}"
    try:
        return ic.kubectl("auth", "can-i", verb, "pods", "--subresource=exec", "-n", NAMESPACE,
                          who).strip()  # fmt: skip
    except UserError as exc:  # kubectl exits 1 for "no", saying it on stdout only
        text = str(exc)
        return "no" if text.endswith("(no message)") or text.endswith(" no") else text


def test_hostile_cases_run_only_in_their_own_staging_pods(incluster: InCluster) -> None:
    """Issue 39: with the scanner off, a case whose staging runs a shell leaves its marker
    only in its own run directory (written in its staging pod): none beside the operator's
    store, in the run directories' parent, the case root, another Simulation's directory
    or the operator's pod; no token copied, none in any status. A case whose controlDict
    loads its own library runs it in its staging pod and its rank pods only, and the link
    its ranks put in place of the solver's log (to the operator's store) is never followed.
    A case whose staging never ends fails StageFailed at the deadline, and a plain
    Simulation created meanwhile is launched before that."""
    ic = incluster
    runs = ic.deployed.runs_dir  # the operator's claim: its store, every namespace's part
    cases = ic.tenant / "cases"
    cases.mkdir(exist_ok=True)
    other = ic.tenant / "runs" / "another-simulation"
    other.mkdir(parents=True, exist_ok=True)
    in_pod = IN_POD
    # the operator's store directory, the users' part, its run directories, its case root,
    # another Simulation's, the root filesystem (read-only), as a user's pod names them
    targets = [manifests.RUNS_PATH, str(in_pod), str(in_pod / "runs"), str(in_pod / "cases"),
               str(in_pod / "runs" / other.name), "/tmp/.."]  # fmt: skip
    store = manifests.STORE  # (where the operator's pod has it)
    made = [hostile.escaping_case(cases, targets), hostile.sleeping_case(cases),
            hostile.library_case(cases, targets, store)]  # fmt: skip
    for case in made:
        hostile.give_to_pods(case, manifests.RUN_AS)
    link = hostile.linked_case(cases, other, in_pod / "runs" / other.name)
    secrets_before = set(runs.rglob(hostile.SECRET))  # (this one, and any an earlier run left)
    names = {"hostile-escape": (str(in_pod / "cases" / made[0].name), 20),
             "hostile-sleeper": (str(in_pod / "cases" / made[1].name), 20),
             "hostile-library": (str(in_pod / "cases" / made[2].name), 20),
             "hostile-link": (str(in_pod / "cases" / link.name), 20),
             "plain-meanwhile": ("pitzDaily", 20)}  # fmt: skip
    ic.delete_simulations(*names)
    manifest = runs / "hostile.json"
    first = [_simulation(n, *names[n]) for n in names if n != "plain-meanwhile"]
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": first}))
    ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
    try:
        ic.wait("the sleeper's staging pod", lambda: any(
            p["status"].get("phase") == "Running"
            for p in ic.pods("rankpack.dev/role=staging")), 180)  # fmt: skip
        manifest.write_text(json.dumps(_simulation("plain-meanwhile", *names["plain-meanwhile"])))
        ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
        ic.wait("the five to end",
                lambda: all(ic.status(n).get("phase") in ("Succeeded", "Failed") for n in names),
                300)  # fmt: skip
        st = {n: ic.status(n) for n in names}
        for n, s in st.items():
            print(f"{n}: {json.dumps(s)[:1200]}")
        # the escaping case's code ran, in its staging pod, and reached nothing else
        esc = st["hostile-escape"]
        assert esc["phase"] == "Succeeded", esc
        own = runs / Path(esc["runDir"]).relative_to(manifests.RUNS_PATH)
        assert (own / hostile.OWN_MARK).read_text().strip() == "ran"
        # the case's own library (controlDict's libs) ran where its programs ran: meshing in
        # its staging pod, the solver in its rank pods; it reached nothing else either
        lib = st["hostile-library"]
        lib_own = runs / Path(lib["runDir"]).relative_to(manifests.RUNS_PATH)
        ran = {p.name.removeprefix(hostile.LIB_MARK) for p in lib_own.glob(hostile.LIB_MARK + "*")}
        assert {"blockMesh", "simpleFoam"} <= ran, ran
        # its ranks made the solver's log a link to the operator's store: never followed
        assert (lib_own / "log.simpleFoam").is_symlink()
        assert "SQLite" not in json.dumps(lib) + json.dumps(ic.simulation_events("hostile-library"))
        escaped = [p for p in runs.rglob(hostile.MARK)
                   if not p.is_relative_to(own) and not p.is_relative_to(lib_own)]  # fmt: skip
        assert escaped == [], escaped
        # a case that is a link to another Simulation's directory (made after admission
        # could look): resolved in its staging pod, where that directory is not
        linked = st["hostile-link"]
        assert linked["phase"] == "Failed" and linked["result"]["reason"] in (
            "NotACase", "CaseNotConfined", "StageFailed"), linked  # fmt: skip
        copies = sorted(set(runs.rglob(hostile.SECRET)) - secrets_before)
        assert copies == [] and hostile.SECRET not in json.dumps(st), copies
        assert not (own / hostile.TOKEN_COPY).exists() or not (own / hostile.TOKEN_COPY).read_text()
        listing = (own / hostile.LISTING).read_text()
        assert "operator.db" not in listing and other.name not in listing, listing
        for op in ic.operator_pods():  # the leader and the standby
            seen = ic.kubectl("exec", "-n", manifests.SYSTEM_NAMESPACE, op["metadata"]["name"],
                              "--", "ls", "-a", "/tmp", manifests.RUNS_PATH)  # fmt: skip
            assert hostile.MARK not in seen and hostile.OWN_MARK not in seen, seen
        # the sleeper ran to its deadline and failed with a code; the plain one went ahead
        slept = st["hostile-sleeper"]
        assert slept["phase"] == "Failed", slept
        assert slept["result"]["reason"] == "StageFailed", slept
        assert "deadline" in slept["result"]["message"], slept
        plain = st["plain-meanwhile"]
        assert plain["phase"] == "Succeeded", plain
        launched = hostile.event_time(ic.simulation_events("plain-meanwhile"), "Launched")
        failed = hostile.condition_time(slept, "Failed")
        assert launched is not None and failed is not None and launched < failed, (plain, slept)
        # the launcher enters its own rank pods by their key: it may exec into no pod (the
        # operator's among them), decision 0013
        for verb in ("create", "get"):
            answer = _can_i(ic, verb, "rankpack-launcher")
            assert answer == "no", f"the launcher may {verb} pods/exec: {answer}"
        assert _can_i(ic, "create", "rankpack-backend") == "yes"  # (the check can say yes)
        # no token anywhere a user reads; no staging pod left
        text = json.dumps(st)
        assert "eyJhbGci" not in text, text
        assert ic.pods("rankpack.dev/role=staging") == []
    finally:
        ic.print_operator_log(30)
        ic.delete_simulations(*names)


def test_another_tenants_pod_it_cannot_read_is_counted_through_the_agent(
    incluster: InCluster,
) -> None:
    """Issue 40: a pod of a namespace the operator may not read holds most of the node;
    the node's agent counts it (``requestedMillis``), so the operator fits the launch into
    the room that is really left (``LaunchFitted``): its pod is scheduled at once, never
    rolled back ``Unschedulable``, and the Simulation runs to the end, launched once."""
    from kubernetes import client

    from tests.k8s.pods import tenant_pod

    ic = incluster
    core = client.CoreV1Api(ic.k8s.admin_api())
    name = "incluster-crowded"
    ic.delete_simulations(name)
    try:
        with tenant_pod(core, "rankpack-test-tenant", 1500):
            body = _simulation(name, "pitzDaily", 100)
            body["spec"]["phases"] = [{"startFraction": 0.0, "requestMillis": [500, 500]}]
            manifest = ic.deployed.runs_dir / "crowded.json"
            manifest.write_text(json.dumps(body))
            ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
            ic.wait("it to end", lambda: ic.status(name).get("phase") in ("Succeeded", "Failed"),
                    300)  # fmt: skip
            st = ic.status(name)
            events = ic.simulation_events(name)
            said = {e["reason"]: e.get("message", "") for e in events}
            print(f"\nfitted: {said.get('LaunchFitted')}; launched: {said.get('Launched')}")
            assert st["phase"] == "Succeeded", st
            reasons = [e["reason"] for e in events]
            assert reasons.count("Launched") == 1, reasons  # launched once, never rolled back
            # the node's 2000m less the tenant's 1500m and rankpack's own 200m: 300m left
            fitted = said.get("LaunchFitted", "")
            assert "unrequested" in fitted, said
            left = int(fitted.split(" to the ")[1].split("m")[0])
            assert left <= 300, fitted
            assert "Unschedulable" not in json.dumps(events), reasons
    finally:
        ic.delete_simulations(name)


def _endless_case(ic: InCluster) -> str:
    """The long pitzDaily in the users' cases, owned by the pods' user; its path in a pod."""
    cases = ic.tenant / "cases"
    cases.mkdir(exist_ok=True)
    os.chown(cases, manifests.RUN_AS, manifests.RUN_AS)
    case = endless_pitzdaily(cases)
    for path in [case, *case.rglob("*")]:
        os.chown(path, manifests.RUN_AS, manifests.RUN_AS)
    return str(IN_POD / "cases" / case.name)


def _ended(ic: InCluster, name: str) -> bool:
    return ic.status(name).get("phase") in ("Succeeded", "Failed")


def _scale_operator(ic: InCluster, replicas: int) -> None:
    ic.kubectl("scale", "deployment", manifests.NAME, "-n", manifests.SYSTEM_NAMESPACE,
               f"--replicas={replicas}")  # fmt: skip


def test_a_run_that_ends_while_no_operator_runs_keeps_its_per_rank_results(
    incluster: InCluster,
) -> None:
    """Issue 40: a Simulation that ends while no operator runs (both replicas scaled to 0)
    is adopted ended by the next leader with a duty cycle for every rank (its ranks' final
    records on the case volume, written at MPI_Finalize) and CPU-seconds within 20 % of
    the same case's run that an operator watched to its end."""
    from rankpack.backend.kubernetes.objects import builders

    ic = incluster
    case = _endless_case(ic)
    watched, away = "incluster-watched", "incluster-away"
    ic.delete_simulations(watched, away)
    bodies = []
    for name in (watched, away):
        body = _simulation(name, case, 1500)
        body["spec"].update(wait="polite", sizing="fixed")  # no live switch, no resize
        bodies.append(body)
    manifest = ic.deployed.runs_dir / "adopted-ended.json"
    try:
        manifest.write_text(json.dumps(bodies[0]))
        ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
        ic.wait("the watched run to end", lambda: _ended(ic, watched), 420)
        seen = ic.status(watched)
        assert seen["phase"] == "Succeeded", seen
        manifest.write_text(json.dumps(bodies[1]))
        ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
        ic.wait("the other running", lambda: ic.status(away).get("phase") == "Running", 300)
        _scale_operator(ic, 0)
        ic.wait("no operator left", lambda: not ic.operator_pods(), 120)
        sim_id = ic.status(away)["simId"]
        launcher = f"{builders.ROLE_LABEL}={builders.LAUNCHER_ROLE},{builders.SIM_LABEL}={sim_id}"
        (pod,) = ic.pods(launcher)
        assert pod["status"]["phase"] == "Running", pod["status"]  # it ends while none runs
        ic.wait("its launcher to end", lambda: ic.pods(launcher)[0]["status"]["phase"] in (
            "Succeeded", "Failed"), 420)  # fmt: skip
        assert ic.status(away)["phase"] == "Running"  # nobody wrote its end
        _scale_operator(ic, manifests.REPLICAS)
        ic.wait("the next leader to write its end", lambda: _ended(ic, away), 300)
        st = ic.status(away)
        print(f"\nwatched: {json.dumps(seen)[:1200]}\nadopted ended: {json.dumps(st)[:1200]}")
        assert st["phase"] == "Succeeded" and st["iterations"] == 1500, st
        for end in (seen, st):  # each rank's figures over its whole run
            ranks = end["result"]["ranks"]
            assert len(ranks) == 2 and all(r.get("duty") is not None for r in ranks), end
        watched_cpu, adopted_cpu = seen["result"]["cpuSeconds"], st["result"]["cpuSeconds"]
        print(f"CPU-seconds: watched {watched_cpu}, adopted after its end {adopted_cpu}")
        assert watched_cpu > 0 and abs(adopted_cpu - watched_cpu) <= 0.2 * watched_cpu, (
            watched_cpu, adopted_cpu)  # fmt: skip
        events = sorted(ic.simulation_events(away), key=lambda e: str(e.get("firstTimestamp")))
        said = [(e.get("firstTimestamp"), e["reason"], e.get("count"), e.get("message", "")[:200],
                 (e.get("source") or {}).get("component") or e.get("reportingInstance"))
                for e in events]  # fmt: skip
        reasons = [e["reason"] for e in events]
        assert reasons.count("Launched") == 1 and reasons.count("Succeeded") == 1, said
    finally:
        _scale_operator(ic, manifests.REPLICAS)
        ic.print_operator_log(30)
        ic.delete_simulations(watched, away)
