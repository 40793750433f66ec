"""A Simulation's own image on the dev cluster (issue 41's "Done when"; ``k8s_slow``: the
test images built or taken from the cache, loaded into the node, about 10 minutes):

``rankpack dev-cluster load-image`` puts the three test images (`testimages`) on the node;
the in-cluster operator (``deploy/dev``, the namespace PodSecurity ``restricted``) allows
each image's prefix for its own solver (``--allow-image PREFIX=SOLVER``, and the admission
policy's ``imagePrefixes``). As a user who may only create, get, list and delete
Simulations:

- Debian 13's OpenFOAM with Open MPI 5: a 4-rank weighted pitzDaily (its case on the
  volume, without the streamlines function object Debian 13's v1912 fails on, and without
  its residualControl) at default sizing ends Succeeded with a duty cycle for every rank,
  in-place resizes and no restart; while it runs, its ranks' ``libmpi.so.40`` is the
  image's Open MPI 5 (``ompi_info`` there says 5.x) and the only file of rankpack's they
  map is the shim;
- the MPICH image: rankloop on 2 ranks ends Succeeded with a duty cycle for every rank
  (its case meshed and decomposed with rankpack's OpenFOAM: the image has none);
- an image outside the allowlist is refused at create with ``ImageNotAllowed``;
- the image whose solver links no MPI ends Failed with ``UnsupportedMPI``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.case.openfoam import EXAMPLES_ROOT, KNOWN_TUTORIALS
from rankpack.devcluster import deploy, testimages
from rankpack.devcluster.binaries import DEFAULT_VERSION, KubeVersion, bin_dir
from rankpack.devcluster.layout import NAMESPACE, Layout
from rankpack.operator import crd, manifests
from tests.cli_runner import rankpack
from tests.k8s import hostile
from tests.k8s.conftest import DevCluster
from tests.k8s.kubeconfigs import token_kubeconfig
from tests.k8s.waits import until

pytestmark = pytest.mark.k8s_slow

REPO = Path(__file__).resolve().parents[2]
SIMS = f"simulations.{crd.GROUP}"
USER = "own-image-user"
ENFORCE = "pod-security.kubernetes.io/enforce"
IN_POD = Path(manifests.tenant_path(NAMESPACE))
SOLVERS = {"openfoam-trixie": "simpleFoam", "mpich-rankloop": "rankloop",
           "serial-rankloop": "rankloop-serial"}  # fmt: skip


@dataclass
class Own:
    layout: Layout
    version: KubeVersion
    images: dict[str, testimages.BuiltTestImage]
    user: Path
    """A kubeconfig of a user who may only create, get, list and delete Simulations."""
    cases: Path
    """The users' case root on this host (``IN_POD / "cases"`` in the pods)."""

    def kubectl(self, *args: str, timeout_s: float = 60) -> str:
        return deploy.kubectl(self.layout, self.version, [*args], timeout_s)

    def status(self, name: str) -> dict[str, Any]:
        got = json.loads(self.kubectl("get", SIMS, name, "-n", NAMESPACE, "-o", "json"))
        return dict(got.get("status") or {})

    def create(self, body: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
        """``body`` created as the user (one of that name an earlier run left, deleted)."""
        self.kubectl("delete", SIMS, body["metadata"]["name"], "-n", NAMESPACE,
                     "--ignore-not-found", "--wait=true")  # fmt: skip
        argv = [str(bin_dir(self.version) / "kubectl"), f"--kubeconfig={self.user}", "create",
                "-n", NAMESPACE, *flags, "-f", "-"]  # fmt: skip
        return subprocess.run(argv, input=json.dumps(body), capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip

    def wait(self, what: str, cond: Any, timeout_s: float) -> None:
        until(what, cond, timeout_s)


def _user(own_layout: Layout, version: KubeVersion, tmp: Path) -> Path:
    def kubectl(*args: str) -> str:
        return deploy.kubectl(own_layout, version, [*args], 60)

    for args in (
        ("serviceaccount", USER),
        ("role", USER, "--verb=create,get,list,delete", f"--resource={SIMS}"),
        ("rolebinding", USER, f"--role={USER}", f"--serviceaccount={NAMESPACE}:{USER}"),
    ):
        kubectl("delete", args[0], USER, "-n", NAMESPACE, "--ignore-not-found")
        kubectl("create", *args, "-n", NAMESPACE)
    token = kubectl("create", "token", USER, "-n", NAMESPACE, "--duration=1h").strip()
    return token_kubeconfig(own_layout.admin_kubeconfig, token, NAMESPACE,
                            tmp / "own-image-user.kubeconfig")  # fmt: skip


def _case(cases: Path, name: str, application: str) -> str:
    """pitzDaily as a user's case on the volume: its application ``application``, no
    residualControl (it runs the iterations asked for), no streamlines function object.
    Earlier runs' cases are removed (the staged copy is the run directory's)."""
    for old in cases.iterdir():
        shutil.rmtree(old, ignore_errors=True)
    case = cases / name
    shutil.copytree(EXAMPLES_ROOT / KNOWN_TUTORIALS["pitzDaily"], case)
    fv = case / "system" / "fvSolution"
    fv.write_text(re.sub(r"residualControl\s*\{[^}]*\}", "", fv.read_text()))
    cd = case / "system" / "controlDict"
    text = re.sub(r"#includeFunc\s+streamlines", "", cd.read_text())
    cd.write_text(re.sub(r"application\s+\w+;", f"application {application};", text))
    hostile.give_to_pods(case, manifests.RUN_AS)
    return str(IN_POD / "cases" / name)


@pytest.fixture(scope="module")
def own(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Own]:
    dev_cluster.ensure_up()
    layout, version = Layout(dev_cluster.state_dir), KubeVersion.parse(DEFAULT_VERSION)
    images = {b.name: b for b in testimages.ensure_test_images(REPO, say=lambda _m: None)}
    for built in images.values():
        done = rankpack("dev-cluster", "load-image", str(built.archive), timeout=600)
        assert done.returncode == 0, done.stderr
    deployed = deploy.deploy(layout, version, 300)

    def kubectl(*args: str) -> str:
        return deploy.kubectl(layout, version, [*args], 120)

    kubectl("label", "namespace", NAMESPACE, f"{ENFORCE}=restricted", "--overwrite")
    prefixes = {name: b.ref.rsplit(":", 1)[0] for name, b in images.items()}
    flags = [w for name, p in prefixes.items() for w in ("--allow-image", f"{p}={SOLVERS[name]}")]
    kubectl("patch", "deployment", manifests.NAME, "-n", manifests.SYSTEM_NAMESPACE,
            "--type=json", "-p",
            json.dumps([{"op": "add", "path": "/spec/template/spec/containers/0/command/-",
                         "value": flag} for flag in [*flags, *hostile.SANDBOX_FLAGS]]))  # fmt: skip
    params = json.loads(kubectl("get", "configmap", "rankpack-admission", "-n",
                                manifests.SYSTEM_NAMESPACE, "-o", "json"))  # fmt: skip
    allowed = [params["data"]["imagePrefixes"], *prefixes.values()]
    kubectl(
        "patch",
        "configmap",
        "rankpack-admission",
        "-n",
        manifests.SYSTEM_NAMESPACE,
        "--type=merge",
        "-p",
        json.dumps({"data": {"imagePrefixes": ",".join(allowed)}}),
    )
    cases = deployed.runs_dir / "namespaces" / NAMESPACE / "cases"
    cases.mkdir(parents=True, exist_ok=True)
    os.chown(cases, manifests.RUN_AS, manifests.RUN_AS)
    try:
        deploy.wait_rolled_out(layout, version, ["deployments"], 300)
        # an old pod (terminating, without these flags) may lead for a few seconds more
        # and refuse a Simulation created meanwhile: wait for a new one to lead
        until("an operator with the allowlist to lead", lambda: _allowlist_leads(kubectl), 180)
        user = _user(layout, version, tmp_path_factory.mktemp("own"))
        own = Own(layout, version, images, user, cases)
        # the API's policy reads its parameters through an informer: the patched prefixes
        # reach it a moment later (a create right after was refused ImageNotAllowed)
        probe = _body("own-probe", images["openfoam-trixie"].ref, "pitzDaily")
        until("the admission policy to allow the test images",
              lambda: own.create(probe, "--dry-run=server").returncode == 0, 120)  # fmt: skip
        yield own
    finally:
        print(kubectl("logs", "-n", manifests.SYSTEM_NAMESPACE, f"deployment/{manifests.NAME}",
                      "--tail=40", "--timestamps"))  # fmt: skip
        kubectl("label", "namespace", NAMESPACE, f"{ENFORCE}=privileged", "--overwrite")
        for kind, name in (("deployment", manifests.NAME), ("daemonset", "rankpack-node-agent")):
            kubectl("delete", kind, name, "-n", manifests.SYSTEM_NAMESPACE, "--ignore-not-found",
                    "--wait=true")  # fmt: skip
        kubectl("delete", "validatingadmissionpolicy,validatingadmissionpolicybinding", "-l",
                "app.kubernetes.io/managed-by=rankpack", "--ignore-not-found")  # fmt: skip


def _allowlist_leads(kubectl: Any) -> bool:
    ns = manifests.SYSTEM_NAMESPACE
    lease = json.loads(kubectl("get", "lease", manifests.NAME, "-n", ns, "-o", "json"))
    holder = (lease.get("spec") or {}).get("holderIdentity")
    selector = f"app.kubernetes.io/name={manifests.NAME}"
    pods = json.loads(kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))["items"]
    return any(
        p["metadata"]["name"] == holder
        and "deletionTimestamp" not in p["metadata"]
        and "--allow-image" in p["spec"]["containers"][0]["command"]
        for p in pods
    )


def _body(name: str, image: str, case: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
            "spec": {"case": {"path": case}, "image": image, **spec}}  # fmt: skip


def _ended(own: Own, name: str) -> bool:
    return own.status(name).get("phase") in ("Succeeded", "Failed")


def _succeeded(own: Own, name: str, ranks: int) -> dict[str, Any]:
    """``name``'s status once it ended: Succeeded, with a duty cycle for every rank."""
    own.wait(f"{name} to end", lambda: _ended(own, name), 900)
    st = own.status(name)
    shown = ("phase", "iterations", "resizes", "restarts", "duty", "efficiency")
    print(f"{name}: {json.dumps({k: st.get(k) for k in shown})}; duty per rank "
          f"{[r.get('duty') for r in st.get('ranks') or []]}")  # fmt: skip
    assert st["phase"] == "Succeeded", st
    duty = [r.get("duty") for r in st["ranks"]]
    assert len(duty) == ranks and all(d is not None and d > 0 for d in duty), st["ranks"]
    return st


def _rank_pids(image_version: str) -> list[int]:
    """This host's simpleFoam processes whose root filesystem is Debian ``image_version``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
            release = (proc / "root" / "etc" / "os-release").read_text()
        except OSError:
            continue
        if argv0.endswith(b"simpleFoam") and f'VERSION_ID="{image_version}"' in release:
            pids.append(int(proc.name))
    return pids


def _mapped(pid: int) -> set[str]:
    paths = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            paths.add(parts[5])
    return paths


def test_open_mpi_5_in_the_users_image_runs_weighted_pitzdaily(own: Own) -> None:
    image = own.images["openfoam-trixie"].ref
    # a case name of its own: sizes learned from an earlier run of the same case would start
    # it sized, with no resize to make (controller/learned.py)
    case = _case(own.cases, f"pitzDailyTrixie{int(time.time())}", "simpleFoam")
    made = own.create(_body("own-trixie", image, case, ranks=4, weights=[1, 1, 5, 15],
                            iterations=1500))  # fmt: skip
    assert made.returncode == 0, made.stderr
    seen: dict[int, set[str]] = {}

    def ranks_seen() -> bool:
        for pid in _rank_pids("13"):
            try:
                seen[pid] = _mapped(pid)
            except OSError:
                continue
        return len(seen) >= 4

    own.wait("the trixie Simulation's four ranks", ranks_seen, 600)
    pid = next(iter(seen))
    ompi = subprocess.run(["chroot", f"/proc/{pid}/root", "ompi_info", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert re.search(r"Open MPI v5\.", ompi.stdout), ompi.stdout + ompi.stderr
    for maps in seen.values():
        libmpi = [p for p in maps if "/libmpi.so.40" in p]
        assert libmpi and all(p.startswith("/usr/lib/") for p in libmpi), sorted(maps)
        ours = [p for p in maps if "rankpack" in p]
        assert len(ours) == 1 and ours[0].endswith("librankpack_pmpi.openmpi.so"), ours
    st = _succeeded(own, "own-trixie", 4)
    assert st["restarts"] == 0 and st["resizes"] >= 1, st


def test_mpich_in_the_users_image_runs_rankloop(own: Own) -> None:
    image = own.images["mpich-rankloop"].ref
    case = _case(own.cases, "rankloopCase", "rankloop")
    made = own.create(_body("own-mpich", image, case, ranks=2, iterations=300))
    assert made.returncode == 0, made.stderr
    _succeeded(own, "own-mpich", 2)


def test_an_image_out_of_the_allowlist_is_refused_and_one_without_mpi_fails(own: Own) -> None:
    refused = own.create(_body("own-evil", "evil.example/miner:1", "pitzDaily"))
    assert refused.returncode != 0 and "ImageNotAllowed" in refused.stderr, refused.stderr
    image = own.images["serial-rankloop"].ref
    case = _case(own.cases, "serialCase", "rankloop-serial")
    made = own.create(_body("own-serial", image, case, ranks=2, iterations=20))
    assert made.returncode == 0, made.stderr
    own.wait("the no-MPI Simulation to end", lambda: _ended(own, "own-serial"), 600)
    st = own.status("own-serial")
    assert st["phase"] == "Failed" and st.get("reason") == "UnsupportedMPI", st
