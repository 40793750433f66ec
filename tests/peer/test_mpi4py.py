"""The peer tier: mpi4py's own test suite must give the same result with the shim as without.

mpi4py (built from its PyPI sdist against the system Open MPI and MPICH by
``tests/peer/install_mpi4py.sh``, cached outside the checkout) runs its whole suite under
``mpirun -np N`` for N = 2 and 4 (4 ranks: the modules in `SUBSET`, the whole suite is
``peer_slow``): once without the shim (the reference), then with the
installed shim preloaded in every wait mode - spin, polite, adaptive - and once while a
thread flips every rank's control word among the three every 50 ms ("switching"); spin,
polite and adaptive alone are ``peer_slow`` too (`SLOW_MODES`). Every
test's outcome on every rank must equal the reference's; a hang is a failure at the run's
timeout. The suite runs with its own default options (quiet), except what hangs here
without the shim: Open MPI 4.1.x's spawn tests (off in mpi4py's own CI too) and MPICH
4.0.2's test_util_sync (see SUITE_ENV).

Settings: RANKPACK_PEER_CACHE (build cache), RANKPACK_PEER_TIMEOUT_S (per run, default 150 s
per rank), RANKPACK_PEER_SUMMARY (a file to which one JSON line per run is appended: counts,
wall time, mode switches, sleeps), RANKPACK_PEER_ARGS (development only: extra options for
mpi4py's test/main.py, e.g. "--no-numpy -i test_ulfm" to run a part of the suite quickly;
the tier's definition is the whole suite, without it).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankpack.errors import UserError
from rankpack.profile.records import RankRecord, read_record, set_wait_mode
from rankpack.profile.shim import shim_env

pytestmark = pytest.mark.peer

HERE = Path(__file__).resolve().parent
VERSION = "4.1.2"
CACHE = Path(os.environ.get("RANKPACK_PEER_CACHE", "/var/cache/rankpack/mpi4py"))
FLAVOURS = ("openmpi", "mpich")
RANKS = (2, 4)
SHIM_MODULES = [
    "test_cco_buf_inter", "test_cco_obj_inter", "test_cco_vec_inter", "test_cco_nb_buf",
    "test_cco_obj", "test_comm_inter", "test_p2p_obj", "test_p2p_buf_matched",
    "test_request", "test_grequest", "test_status", "test_errhandler", "test_ulfm",
    "test_threads",
]  # fmt: skip
SUBSET = {("mpich", 4): SHIM_MODULES, ("openmpi", 4): SHIM_MODULES}
"""Configurations the README's test command runs on a part of the suite: the modules of
what the shim changes (blocking and nonblocking collectives, intercommunicators,
point-to-point, requests and generalized requests, statuses, error handlers, ULFM,
threads). MPICH 4.0.2 (ch4:ucx) polls without ever yielding the CPU (no sched_yield in its
progress loop), so 4 ranks on 2 cores advance one time slice at a time: the whole suite
without the shim did not finish in 40 min here (test_p2p_buf alone > 300 s; 2 ranks: 29 s).
Open MPI with 4 ranks yields, but its whole suite took 300 s without the shim and 294 s
"switching" in a CI run here (10 min of the README's test command; the 2-rank whole suite
already covers every module). The whole suite for these is ``peer_slow`` (``pytest -m
peer_slow tests/peer``), for machines with a core per rank."""
CONFIGS = [
    pytest.param(
        f, n, "whole", id=f"{f}-{n}", marks=[pytest.mark.peer_slow] if (f, n) in SUBSET else []
    )
    for f in FLAVOURS
    for n in RANKS
] + [pytest.param(f, n, "subset", id=f"{f}-{n}-subset") for f, n in SUBSET]  # fmt: skip
SHIM_MODES = ("spin", "polite", "adaptive", "switching")
SLOW_MODES = {n: ("spin", "polite", "adaptive") for n in RANKS}
"""Shim runs the README's test command leaves to ``peer_slow``: each mode alone (2 ranks:
74-228 s a run, about 11 min for the six; 4 ranks: about 10 min more). What it runs of the
shim is the "switching" run of each configuration, which passes every rank through all
three modes every 50 ms."""
SHIM_RUNS = [
    pytest.param(
        *config.values, mode, id=f"{config.id}-{mode}",
        marks=[*config.marks, *([pytest.mark.peer_slow]
                                if mode in SLOW_MODES.get(config.values[1], ()) else [])],
    )
    for config in CONFIGS
    for mode in SHIM_MODES
]  # fmt: skip
TIMEOUT_S = {n: float(os.environ.get("RANKPACK_PEER_TIMEOUT_S", 300 * n)) for n in RANKS}
"""Per run. The whole suite takes 30-110 s (Open MPI, 2 and 4 ranks) and 30-210 s (MPICH, 2
ranks; adaptive is the slowest) on a lightly loaded 2-core machine; a hang costs this."""
SWITCH_EVERY_S = 0.05
PYTEST_TIMEOUT_S = 2 * max(TIMEOUT_S.values()) + 600
"""pytest-timeout for one test (a reference run and a shim run, plus a build): above the
runs' own timeouts, which kill the ranks and report the hang themselves."""
SUITE_ENV = {
    "openmpi": {"MPI4PY_TEST_SPAWN": "0"},
    "mpich": {},
}
RACY = ("TestThreadPool.test_terminate",)
"""Tests left out of every run, with and without the shim: they make no MPI call (so the
shim cannot change them) and race in themselves. ``test_util_pool.TestThreadPool
.test_terminate`` (mpi4py.util.pool over a ``concurrent.futures`` thread pool) expects a
task queued behind 100 sleeps to be cancelled by ``terminate()``; once in a CI run (MPICH,
2 ranks, spin) it had run: 'pass' without the shim, 'fail' with it."""
SUITE_ARGS = {
    "openmpi": [arg for test in RACY for arg in ("-x", test)],
    "mpich": ["-e", "test_util_sync", *(arg for test in RACY for arg in ("-x", test))],
}
"""The suite's own switches, per MPI, the same with and without the shim: what hangs here
*without* the shim, so that there is no reference to compare with, and `RACY`.

* Open MPI 4.1.x: no MPI_Comm_spawn tests - mpi4py's own CI turns them off for 4.1.x
  (test/mpitestutil.py, ``disable_mpi_spawn``); here the run without the shim hangs in
  test_spawn.TestSpawnMultipleWorld.testArgsOnlyAtRoot (and test_dynproc times out in
  PMIx ``Lookup_name``).
* MPICH 4.0.2 (ch4:ucx): no test_util_sync - its RMA-based mutex, condition and semaphore
  hang without the shim (2 ranks, 150 s: test_util_sync.TestConditionMutexWorld
  .testWaitForNotify errors on one rank while the other spins in ``Mutex.free``; with the
  condition tests left out the module still hangs)."""
EXTRA_ARGS = shlex.split(os.environ.get("RANKPACK_PEER_ARGS", ""))


@dataclass
class SuiteRun:
    outcomes: dict[int, dict[str, str]]
    """rank -> test id -> pass/fail/error/skip/xfail/xpass."""
    tests_run: dict[int, int]
    wall_s: float
    records: list[RankRecord]
    switch_writes: int
    log: str

    def counts(self) -> dict[int, dict[str, int]]:
        return {r: dict(collections.Counter(o.values())) for r, o in self.outcomes.items()}


def mpi4py_site(flavour: str) -> Path:
    """The cached build for a flavour; built (minutes, once) if it is missing."""
    dest = CACHE / f"{VERSION}-{flavour}"
    if not (dest / ".complete").is_file():
        subprocess.run(
            ["bash", str(HERE / "install_mpi4py.sh"), sys.executable, flavour],
            check=True,
            timeout=3600,
            env={**os.environ, "RANKPACK_PEER_CACHE": str(CACHE)},
        )
    return dest / "site"


def _mpirun(flavour: str, n: int, env: dict[str, str], argv: list[str]) -> list[str]:
    if flavour == "openmpi":
        cmd = ["mpirun.openmpi", "-np", str(n), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        for name, value in env.items():
            cmd += ["-x", f"{name}={value}"]
    else:
        cmd = ["mpirun.mpich", "-np", str(n)]
        for name, value in env.items():
            cmd += ["-genv", name, value]
    return cmd + argv


def _flip_modes(live: Path, stop: threading.Event, writes: list[int]) -> None:
    for mode in itertools.cycle(("polite", "adaptive", "spin")):
        if stop.wait(SWITCH_EVERY_S):
            return
        for path in live.glob("rank-*.rec"):
            try:
                set_wait_mode(path, mode)
                writes[0] += 1
            except (UserError, OSError):
                pass  # not published yet, or replaced meanwhile: the next turn gets it


def run_suite(
    flavour: str, n: int, workdir: Path, mode: str | None, part: str = "whole"
) -> SuiteRun:
    """mpi4py's suite (or its `SUBSET` for ``part`` "subset") under mpirun; `mode` None:
    without the shim."""
    out, live = workdir / "out", workdir / "live"
    out.mkdir(parents=True)
    env = {"PYTHONPATH": str(mpi4py_site(flavour)), **SUITE_ENV[flavour]}
    if mode is not None:
        initial = "spin" if mode == "switching" else mode
        env.update(shim_env(live, initial, flavour=flavour))
    test_dir = CACHE / f"{VERSION}-src" / "test"
    argv = [sys.executable, str(HERE / "run_mpi4py.py"), str(test_dir), str(out), "-q"]
    argv += SUITE_ARGS[flavour] + EXTRA_ARGS
    if part == "subset":
        argv += [arg for module in SUBSET[flavour, n] for arg in ("-i", module)]
    log_path = workdir / "log.txt"
    stop, writes = threading.Event(), [0]
    flipper = threading.Thread(target=_flip_modes, args=(live, stop, writes), daemon=True)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            _mpirun(flavour, n, env, argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": env["PYTHONPATH"]},
            start_new_session=True,
        )
        if mode == "switching":
            flipper.start()
        try:
            proc.wait(timeout=TIMEOUT_S[n])
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"mpi4py suite ({flavour}, {n} ranks, shim {mode}) hung: killed after "
                f"{TIMEOUT_S[n]} s\n{_tail(log_path)}"
            )
        finally:  # also on any other exception: never leave ranks behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stop.set()
            if flipper.is_alive():
                flipper.join()
    wall_s = time.monotonic() - t0
    outcomes, tests_run = {}, {}
    for rank in range(n):
        path = out / f"rank-{rank}.json"
        if not path.is_file():
            pytest.fail(
                f"rank {rank} wrote no results ({flavour}, {n} ranks, shim {mode}, exit code "
                f"{proc.returncode})\n{_tail(log_path)}"
            )
        data = json.loads(path.read_text())
        outcomes[rank], tests_run[rank] = data["outcomes"], data["tests_run"]
    records = [r for p in sorted(live.glob("rank-*.rec")) if (r := read_record(p)) is not None]
    run = SuiteRun(outcomes, tests_run, wall_s, records, writes[0], _tail(log_path))
    _summary(flavour, n, part, mode or "none", run, proc.returncode)
    return run


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _summary(flavour: str, n: int, part: str, mode: str, run: SuiteRun, code: int) -> None:
    target = os.environ.get("RANKPACK_PEER_SUMMARY")
    if not target:
        return
    line = {
        "flavour": flavour, "ranks": n, "part": part, "mode": mode, "wall_s": round(run.wall_s, 1),
        "exit_code": code, "counts": run.counts(), "switch_writes": run.switch_writes,
        "switches": sum(r.wait_switches for r in run.records),
        "sleeps": sum(r.sleeps for r in run.records),
    }  # fmt: skip
    with open(target, "a") as f:
        f.write(json.dumps(line) + "\n")


_REFERENCE: dict[tuple[str, int, str], SuiteRun] = {}


@pytest.fixture
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    params = request.node.callspec.params
    key = (params["flavour"], params["n"], params["part"])
    if key not in _REFERENCE:
        work = tmp_path_factory.mktemp(f"mpi4py-{key[0]}-{key[1]}-{key[2]}-none")
        _REFERENCE[key] = run_suite(*key[:2], work, None, key[2])
    return _REFERENCE[key]


@pytest.mark.timeout(PYTEST_TIMEOUT_S + 3600)  # may build mpi4py first
@pytest.mark.parametrize(("flavour", "n", "part"), CONFIGS)
def test_reference_run_is_complete(flavour: str, n: int, part: str, reference: SuiteRun) -> None:
    """Without the shim every rank runs the whole suite or subset (the reference is not
    empty)."""
    least = 1 if EXTRA_ARGS else 1000 if part == "whole" else 200
    assert len(reference.outcomes) == n
    for rank, outcomes in reference.outcomes.items():
        assert reference.tests_run[rank] >= least, reference.log
        assert collections.Counter(outcomes.values())["pass"] >= least


@pytest.mark.timeout(PYTEST_TIMEOUT_S + 3600)
@pytest.mark.parametrize(("flavour", "n", "part", "mode"), SHIM_RUNS)
def test_same_results_with_the_shim(
    flavour: str, n: int, part: str, mode: str, reference: SuiteRun, tmp_path: Path
) -> None:
    run = run_suite(flavour, n, tmp_path, mode, part)
    for rank in range(n):
        want, got = reference.outcomes[rank], run.outcomes[rank]
        diff = sorted(
            (t, want.get(t, "absent"), got.get(t, "absent"))
            for t in want.keys() | got.keys()
            if want.get(t) != got.get(t)
        )
        assert not diff, (
            f"rank {rank}: {len(diff)} tests differ from the run without the shim "
            f"(test, without, with): {diff[:20]}\n{run.log}"
        )
    # The shim really was there, in the mode asked for (every world rank has a record).
    assert len(run.records) >= n
    if mode == "switching":
        assert run.switch_writes > 0
        assert sum(r.wait_switches for r in run.records) > 0
    else:
        assert {r.wait_mode for r in run.records} == {mode}
