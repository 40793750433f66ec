"""The test images (`rankpack.devcluster.testimages`): Simulation images as a team would
bring them, built here from Debian's packages with nothing of rankpack, and rankpack's
launch of their MPIs without Kubernetes.

The images are built (or taken from the cache: minutes cold, see docs/own-image.md) and
their archives listed. The Open MPI 5 and MPICH images are unpacked as a runtime would and
run as two "rank pods" and a "launcher pod": each a network, UTS and IPC namespace of its
own (its own address on a bridge, its pod name as host name), the image's root filesystem
as its root, user 1000 with no /etc/passwd entry, the case volume at the same path in all.
The rank pods run ``rankpack-rankd``; the launcher runs ``rankpack-launch`` with the
``launch.json`` the launcher pod's init container writes (`launcher.Preparation`, on a fake
API), so the image's own mpirun starts its daemons in the rank pods through
``rankpack-exec``, as on a cluster.

Needs root, mmdebstrap and umoci (the build), unshare, chroot and ip (the pods), and the
tools' binary (``python -m rankpack.devcluster.toolsbuild``, which setup.sh test runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.objects import keyed
from rankpack.backend.kubernetes.starting import exitwrapper, launcher, mpirunargs, tools
from rankpack.backend.kubernetes.starting.instructions import Instructions
from rankpack.case import mpiabi
from rankpack.case.foamlog import LogParser
from rankpack.devcluster import testimages, testrecipe
from rankpack.devcluster.lifecycle.loadimage import archive_refs
from rankpack.devcluster.testrecipe import recipe
from rankpack.profile.finals import read_finals
from rankpack.profile.shim import shim_env, shim_library
from tests.fakeapi import FakeKubeApi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
SIM = "t1"
PODS = (f"rankpack-{SIM}-g0", f"rankpack-{SIM}-g1")
NET = "10.77.0"
"""The pods' /24 (a bridge in a network namespace of this test's own)."""
RUN_TIMEOUT_S = 180


def _require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("building the images and the pods' namespaces need root")
    for exe in ("mmdebstrap", "umoci", "unshare", "chroot", "ip"):
        if shutil.which(exe) is None:
            pytest.skip(f"{exe} is not installed (bash setup.sh test installs it)")


@pytest.fixture(scope="module")
def built() -> dict[str, testimages.BuiltTestImage]:
    _require_tools()
    return {b.name: b for b in testimages.ensure_test_images(REPO, say=lambda _m: None)}


@contextlib.contextmanager
def _image(archive: Path) -> Iterator[tuple[dict[str, Any], list[Any]]]:
    """An OCI archive's image config and its layers' blobs (gzipped tars), in order."""
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]

        def blob(digest: str) -> Any:
            return outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")

        (entry,) = index["manifests"]
        manifest = json.load(blob(entry["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        yield config["config"], [blob(layer["digest"]) for layer in manifest["layers"]]


def _names(archive: Path) -> list[str]:
    """Every path in the image's layers."""
    names = []
    with _image(archive) as (_config, layers):
        for layer in layers:
            with tarfile.open(fileobj=layer, mode="r|gz") as tar:
                names += [m.name.removeprefix("./") for m in tar]
    return names


@pytest.mark.parametrize("name", ["openfoam-trixie", "mpich-rankloop", "serial-rankloop"])
def test_an_image_holds_nothing_of_rankpack_and_names_itself(
    built: dict[str, testimages.BuiltTestImage], name: str
) -> None:
    image = built[name]
    names = _names(image.archive)
    assert not [n for n in names if "rankpack" in n.lower()]
    assert len(names) > 1000  # (a Debian root filesystem, not an empty listing)
    assert {"usr/bin/sh", "usr/bin/sleep"} <= set(names) or {"bin/sh", "bin/sleep"} <= set(names)
    assert f"usr/local/bin/{image.solver}" in names or f"usr/bin/{image.solver}" in names
    with _image(image.archive) as (config, _layers):
        assert config["User"] == "1000:1000"
        assert config["Env"] == [f"{k}={v}" for k, v in testrecipe.config_env(recipe(name))]
    # `rankpack dev-cluster load-image ARCHIVE` imports it under this name
    assert archive_refs(image.archive) == (image.ref,)


def test_a_second_call_takes_every_image_from_the_cache(
    built: dict[str, testimages.BuiltTestImage],
) -> None:
    again = testimages.ensure_test_images(REPO, say=lambda _m: None)
    assert [b.name for b in again] == list(built)
    assert not any(b.built for b in again) and sum(b.seconds for b in again) < 10
    assert [b.archive for b in again] == [b.archive for b in built.values()]


# -- the images unpacked, and rankpack's launch in them ----------------------------------------


def _unpack(archive: Path, root: Path) -> None:
    """The layers applied in order, as containerd would (they hold no whiteouts)."""
    with _image(archive) as (_config, layers):
        for layer in layers:
            tar = subprocess.Popen(["tar", "-xzp", "--numeric-owner", "-C", str(root)],
                                   stdin=subprocess.PIPE)  # fmt: skip
            assert tar.stdin is not None
            shutil.copyfileobj(layer, tar.stdin)
            tar.stdin.close()
            assert tar.wait(timeout=300) == 0


@pytest.fixture(scope="module")
def roots(built: dict[str, testimages.BuiltTestImage]) -> Iterator[dict[str, Path]]:
    work = Path(tempfile.mkdtemp(prefix="rankpack-testimages-", dir="/var/tmp"))
    try:
        result = {}
        for name, image in built.items():
            result[name] = work / name
            result[name].mkdir()
            _unpack(image.archive, result[name])
        yield result
    finally:
        shutil.rmtree(work)


def _in_root(root: Path, name: str, script: str) -> str:
    """``sh -c script`` in image ``name`` unpacked at ``root``, as 1000:1000 with the image's
    environment and HOME=/ (the runtime's, for a user without a home); its output."""
    env = [f"{k}={v}" for k, v in testrecipe.config_env(recipe(name))]
    argv = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc", "chroot",
            "--userspec=1000:1000", str(root), "env", "-i", "HOME=/", *env,
            "sh", "-c", script]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{script}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("name", ["openfoam-trixie", "mpich-rankloop", "serial-rankloop"])
def test_each_solver_links_the_mpi_its_recipe_says(roots: dict[str, Path], name: str) -> None:
    """What staging finds (`staging.detect_mpi`: the loader's listing, `mpiabi`)."""
    solver = recipe(name).solver
    listing = _in_root(roots[name], name, f"ld.so --list $(command -v {solver})")
    assert mpiabi.family_of(listing) == recipe(name).mpi


def test_the_trixie_image_is_open_mpi_5(roots: dict[str, Path]) -> None:
    root = roots["openfoam-trixie"]
    for name in ("mpirun", "mpirun.openmpi"):  # (launch.json's names, first found first)
        version = _in_root(root, "openfoam-trixie", f"{name} --version")
        assert mpirunargs.openmpi_major(version) == 5
    # libmpi.so.40's file: libtool age 40 is Open MPI 5.0 (4.1's is libmpi.so.40.30.x)
    assert (
        (root / "usr/lib/x86_64-linux-gnu/libmpi.so.40")
        .resolve()
        .name.startswith("libmpi.so.40.40.")
    )


PODS_SCRIPT = r"""
R=$0 WORK=$1 KEY=$2 ENV=$3 LAUNCH=$4 CASE=$1/case
mount --make-rprivate /
mount -t tmpfs tmpfs /run && mkdir /run/netns  # (ip netns's names: this namespace's only)
mount --rbind /dev $R/dev && mount -t tmpfs tmpfs $R/dev/shm && mount -t proc proc $R/proc
mount -t sysfs -o ro sysfs $R/sys && mount -t tmpfs tmpfs $R/tmp && chmod 1777 $R/tmp
mkdir -p $R$WORK $R/etc/rankpack/sim && mount --bind $WORK $R$WORK
mount --bind $KEY $R/etc/rankpack/sim
hostname launcher && ip link set lo up
ip link add br0 type bridge && ip addr add NET.1/24 dev br0 && ip link set br0 up
i=2
for pod in PODS; do
  ip netns add $pod
  ip link add v$i type veth peer name b$i && ip link set b$i master br0 up
  ip link set v$i netns $pod && ip -n $pod addr add NET.$i/24 dev v$i
  ip -n $pod link set v$i up && ip -n $pod link set lo up
  ip netns exec $pod unshare --uts --ipc --mount --pid --fork sh -c "hostname $pod && \
    mount -t tmpfs tmpfs $R/dev/shm && mount -t proc proc $R/proc && \
    mount -t sysfs -o ro sysfs $R/sys && exec chroot --userspec=1000:1000 $R env -i $ENV \
    $CASE/.rankpack/bin/rankpack-rankd" > $CASE/rankd-$pod.log 2>&1 &
  i=$((i + 1))
done
# (not exec'd: this root shell stays the namespace's first process, which --kill-child ends
# with the test's, and everything in the namespace with it; a changed user would lose that)
chroot --userspec=1000:1000 $R env -i $ENV $CASE/.rankpack/bin/rankpack-launch $LAUNCH
""".replace("NET", NET).replace("PODS", " ".join(PODS))


@dataclass(frozen=True)
class Launched:
    code: int | None
    """mpirun's exit code (the exit file); None: stopped once its ranks' work was done."""
    log: str
    spec: dict[str, Any]
    """launch.json."""


def _instructions(case: Path, mpi: str, command: tuple[str, ...], env: dict[str, str],
                  slots: tuple[int, int]) -> Instructions:  # fmt: skip
    hostfile = case / ".rankpack" / "hostfile"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    line = "{} slots={}\n" if mpi == "openmpi" else "{}:{}\n"
    hostfile.write_text("".join(line.format(p, n) for p, n in zip(PODS, slots, strict=True)))
    return Instructions(
        sim_id=SIM, namespace="rankpack", container="rank", pods=PODS, hostfile=hostfile,
        case_dir=case, command=command, env=env, log_path=case / f"log.{command[-2]}",
        exit_path=case / ".rankpack" / "mpirun.exit", start_timeout_s=10, mpi=mpi,
        transport="auto", ranks=sum(slots),
    )  # fmt: skip


def _launch(
    root: Path,
    work: Path,
    ins: Instructions,
    image_env: str,
    *,
    done: Callable[[str], bool] | None = None,
) -> Launched:
    """``ins.command`` in the rank pods, started by ``rankpack-launch`` in the launcher pod
    as its init container prepared it (`launcher.Preparation`, on a fake API whose rank pods
    run). With ``done``, the pods are stopped once the log satisfies it and mpirun has not
    ended 10 s later."""
    case, key, out = ins.case_dir, work / "key", work / "launch"
    for d in (key, out):
        d.mkdir()
    (key / keyed.KEY_ITEM).write_text("k" * 64)
    tools.install(case)
    api = FakeKubeApi()
    for i, pod in enumerate(PODS):
        labels = {"app.kubernetes.io/managed-by": "rankpack", "rankpack.dev/sim": SIM}
        container = {"name": "rank", "resources": {"requests": {"cpu": "1"}}}
        api.create("pods", {"metadata": {"name": pod, "labels": labels},
                            "spec": {"containers": [container]}})  # fmt: skip
        api.run_pod(pod, ip=f"{NET}.{i + 2}")
    spec = launcher.Preparation(ins, api, environ={"RANKPACK_POD_IP": f"{NET}.1"}).run(out)
    for path in (work, case, out):
        path.chmod(0o755)
    for path in (case, *case.rglob("*")):
        if not path.is_symlink():
            shutil.chown(path, 1000, 1000)
    argv = ["unshare", "--net", "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child",
            "sh", "-eu", "-c", PODS_SCRIPT, str(root), str(work), str(key), image_env,
            str(out / "launch.json")]  # fmt: skip

    def log() -> str:
        path = ins.log_path
        return path.read_text(errors="replace").replace("\0", "") if path.exists() else ""

    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if done is not None and done(log()):
                deadline = min(deadline, time.monotonic() + 10)
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()  # (--kill-child: the namespace's first process, and all in it, with it)
        launcher_out = proc.communicate()[0].decode(errors="replace")
    code = exitwrapper.read_exit(ins.exit_path)
    assert code is not None or done is not None, f"no exit file: {launcher_out}\n{log()}"
    return Launched(code, log(), spec)


FOAM_ENV = "HOME=/ PATH=/usr/local/bin:/usr/bin:/bin WM_PROJECT_DIR=/usr/share/openfoam " \
    "LD_LIBRARY_PATH=/usr/lib/openmpi-system"  # fmt: skip
"""What a pod of the trixie image has: its config's environment, HOME=/ from the runtime."""


def _pitzdaily(root: Path, case: Path, steps: int) -> None:
    """pitzDaily meshed and decomposed in 2 with the image's OpenFOAM, as staging does.
    Without its function objects: Debian 13's OpenFOAM 1912 fails the tutorial's
    ``#includeFunc streamlines`` (FOAM FATAL IO ERROR in IOstream "sha1")."""
    case.mkdir(parents=True)
    shutil.chown(case, 1000, 1000)
    tutorial = "/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily"
    dict_ = "numberOfSubdomains 2;\nmethod hierarchical;\nhierarchicalCoeffs{n (2 1 1);}\n"
    script = (
        f"cp -r {tutorial}/. {case} && cd {case} && "
        f"sed -i 's/^endTime .*/endTime {steps};/; /^functions/,$d' system/controlDict && "
        f"printf 'FoamFile{{version 2.0;format ascii;class dictionary;object x;}}\\n{dict_}' "
        "> system/decomposeParDict && blockMesh > log.blockMesh && decomposePar > log.decomposePar"
    )
    mount = f"mkdir -p {root}{case} && mount --bind {case} {root}{case}"
    chroot = f"chroot --userspec=1000:1000 {root} env -i {FOAM_ENV} sh -c {shlex.quote(script)}"
    argv = ["unshare", "--mount", "sh", "-c", f"{mount} && exec {chroot}"]
    subprocess.run(argv, check=True, timeout=120, capture_output=True)


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rankpack-pods-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def _rank_env(case: Path) -> dict[str, str]:
    """The ranks' environment as the operator gives it: pid files, nice values, the shim of
    the case volume with its final records there."""
    lib = case / ".rankpack" / "lib" / "librankpack_pmpi.openmpi.so"
    lib.parent.mkdir(parents=True)
    shutil.copyfile(shim_library("openmpi"), lib)
    final = case / ".rankpack" / "final"
    final.mkdir()
    env = shim_env(Path("/tmp"), "spin", flavour="openmpi", final_dir=final)
    return {**env, "LD_PRELOAD": str(lib), "RANKPACK_PID_DIR": "/tmp",
            "RANKPACK_RANK_NICE": "0,0"}  # fmt: skip


def test_open_mpi_5_runs_pitzdaily_across_two_pods_with_prrtes_options(
    roots: dict[str, Path], work: Path
) -> None:
    root, case = roots["openfoam-trixie"], work / "case"
    _pitzdaily(root, case, steps=5)
    rank_launcher = REPO / "src" / "rankpack" / "backend" / "rank_launcher.sh"
    shutil.copyfile(rank_launcher, case / "rank-launcher")
    command = ("/bin/sh", str(case / "rank-launcher"), "simpleFoam", "-parallel")
    ins = _instructions(case, "openmpi", command, _rank_env(case), (1, 1))
    launched = _launch(root, work, ins, FOAM_ENV)
    code, log, spec = launched.code, launched.log, launched.spec
    assert code == 0, log
    parsed = LogParser()
    parsed.feed(log)
    assert parsed.state.iterations == 5 and parsed.state.ended, log
    assert "(rankpack-t1-g0 1)" in log and "(rankpack-t1-g1 1)" in log  # one rank a pod
    # PRRTE's options, no ORTE name and nothing it warns about (SHELL: no login shell)
    assert "WARNING" not in log and "invalid value" not in log, log
    assert "--prtemca" in spec["args_from_major"]["5"] and "--prtemca" not in spec["args"]
    # the shim (built on Debian 12) bound to Open MPI 5's libmpi.so.40 in both ranks
    finals = read_finals(case / ".rankpack" / "final", 2)
    assert sorted(finals) == [0, 1] and all(f.finalized and f.mpi_s > 0 for f in finals.values())


def test_mpich_runs_rankloops_steps_across_two_pods(roots: dict[str, Path], work: Path) -> None:
    """Every step of rankloop on three ranks in two pods (hydra's proxies started through
    ``rankpack-exec``, TCP between the pods), counted from its log. Its exit is not
    asserted: Debian 12's MPICH 4.0 hung now and then in MPI_Finalize (a rank waits in a PMI
    barrier while the other's UCX disconnect needs it to progress: pmodels/mpich#6596, 8 of
    some 60 runs); the image's Debian 13 MPICH 4.2.1 exited 0 in 8 of 8 runs here."""
    root, case = roots["mpich-rankloop"], work / "case"
    (case / "system").mkdir(parents=True)
    (case / "system" / "controlDict").write_text("startTime 0;\nendTime 0.6;\ndeltaT 0.1;\n")
    ins = _instructions(case, "mpich", ("rankloop", "-parallel"), {}, (2, 1))
    launched = _launch(root, work, ins, "HOME=/ PATH=/usr/local/bin:/usr/bin:/bin",
                       done=lambda log: "\nEnd\n" in log)  # fmt: skip
    parsed = LogParser()
    parsed.feed(launched.log)
    assert "rankloop: 3 ranks, 6 steps" in launched.log, launched.log
    assert parsed.state.iterations == 6 and parsed.state.ended, launched.log
    assert parsed.state.time == 0.6
    assert launched.code in (0, None), launched.log  # (None: stopped in MPI_Finalize, above)
    assert "args_from_major" not in launched.spec
