#!/usr/bin/env python3
"""What does rankpack cost? The same solver run, plain and under rankpack, side by side.

  .venv/bin/python bench/cost.py [--reps 5] [--cases user,pitzDaily] [--configs ...] [--out F]

Every configuration runs the same case with the same decomposition (rankpack's own: its
``hierarchical (N 1 1)`` dictionary, written and decomposed by rankpack's staging code
before the clock starts), the same iteration count and the same number of ranks; within a
repetition the configurations alternate (the order rotates from one repetition to the next),
and each is compared with ``plain`` of the same repetition, pair by pair:

- ``plain``: ``mpirun --oversubscribe -np N SOLVER -parallel`` in the decomposed case;
- ``shim``: the same with the PMPI shim preloaded, in its ``polite`` wait mode (what
  ``auto`` chooses where ranks outnumber cores);
- ``plain-tcp``: ``plain`` with ranks talking over TCP only (``--mca btl self,tcp``): the
  transport of ranks that share no memory (a pod per rank on Kubernetes); not in the
  default set, ask for it with ``--configs``;
- ``rankpack``: ``rankpack run CASE --ranks N --iterations K`` (defaults: the ranks in one
  cgroup weighted by nice values, the shim, ``--wait auto``, the control loop); its
  ``wall_s``;
- ``rankpack-nocg``: the same with ``--no-cgroups`` (one of the suspects, isolated);
- ``rankpack-noshim``: the same with ``--no-shim``;
- ``rankpack-w``: ``rankpack run`` with ``--weights 1,1,5,15 --budget 2`` (the Kubernetes
  comparison's settings), not in the default set;
- ``rankpack-wd``: ``rankpack-w`` with ``--resize duty`` (profiled once past start-up and
  resized in place to the measured duty cycles: what a Simulation's default sizing does;
  ``rankpack run`` keeps the plan's requests unless asked), not in the default set;
- ``k8s-run-w``: the same through ``--backend kubernetes`` on the dev cluster
  (``$RANKPACK_BENCH_KUBECONFIG``, default the dev cluster's backend ServiceAccount;
  ``--allocatable 2``), not in the default set: compared with ``rankpack-w`` of the same
  repetition (``vs_local``; ``vs_local_duty`` against ``rankpack-wd``);
- ``k8s-sim-w``: the same settings as a Simulation on the in-cluster operator
  (``rankpack dev-cluster up --operator`` first), its namespace PodSecurity ``restricted``
  for the run, the real rank image (`k8s_sim`); the operator's own ``wallSeconds``. Its
  case keeps the local side's directory name, so the operator learns its sizes from the
  first repetition as ``rankpack run`` does (`rankpack.controller.learned`): from the
  second repetition on, both start at the sizes they measured, not one side only.

Every ``rankpack`` configuration also records its start-up: from the controller's launch
decision (the ``launch`` event's ``decided_unix``) to the first ``Time =`` line of the
solver's log (watched every 10 ms); the Kubernetes ones, how far above ``rankpack-w``'s of
the same repetition (``startup_above_local_s``), and the solver's own wall: from that
line to the log's last write (``solver_s``; ``solver_vs_local``).

Cases: ``user`` is pitzDaily refined 3x in x and y (110 025 cells, ~27 500 per rank at 4
ranks, 100 iterations); ``pitzDaily`` is the tutorial (12 225 cells, 250 iterations). The
solver's own ``ClockTime`` at its last iteration is recorded beside each wall time.
Writes one JSON file (every run, and per case and configuration the median [min-max] of the
wall time and of its ratio to ``plain``) and prints a table. Root (cgroups); 2 cores: run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from k8s_sim import (  # (bench/, beside this)
    FirstLine,
    clock_time,
    decided,
    run_simulation,
    solver_s,
)

from rankpack.case.openfoam import (
    CaseSource,
    copy_case,
    decompose,
    ensure_mesh,
    find_tutorial,
    foam_env,
    read_application,
    set_iterations,
    write_decompose_dict,
)
from rankpack.profile.shim import shim_env

HERE = Path(__file__).resolve().parent
CASES = {"user": (3, 100), "pitzDaily": (1, 250)}  # scale, iterations
CONFIGS = ("plain", "shim", "rankpack", "rankpack-nocg", "rankpack-noshim")
OPTIONAL = ("plain-tcp", "rankpack-w", "rankpack-wd", "k8s-run-w", "k8s-sim-w")
WEIGHTED = ["--weights", "1,1,5,15", "--budget", "2"]
DEV_KUBECONFIG = "/var/lib/rankpack/dev-cluster/rankpack-sa.kubeconfig"


def prepare(work: Path, case: str, ranks: int) -> tuple[Path, Path, int]:
    """(the case as rankpack is given it, a decomposed copy for mpirun, iterations)."""
    scale, iterations = CASES[case]
    source = work / f"{case}-source"
    if scale == 1:
        copy_case(CaseSource(find_tutorial("pitzDaily"), "pitzDaily", tutorial=True), source)
    else:
        subprocess.run([sys.executable, str(HERE / "scaled_pitzdaily.py"), str(source),
                        "--scale", str(scale)], check=True)  # fmt: skip
    decomposed = work / f"{case}-decomposed"
    shutil.copytree(source, decomposed)
    ensure_mesh(decomposed)
    set_iterations(decomposed, iterations)
    write_decompose_dict(decomposed, ranks)
    cells = decompose(decomposed)
    print(f"{case}: {sum(cells)} cells, {cells} per rank, {iterations} iterations", flush=True)
    return source, decomposed, iterations


def run_plain(work: Path, decomposed: Path, ranks: int, shim: bool,
              tcp: bool = False) -> dict[str, object]:  # fmt: skip
    run_dir = Path(tempfile.mkdtemp(dir=work, prefix="plain-"))
    case = run_dir / "case"
    shutil.copytree(decomposed, case)
    solver = read_application(case)
    env = foam_env(dict(os.environ))
    if shim:
        live = run_dir / "live"
        live.mkdir()
        env.update(shim_env(live, wait_mode="polite"))
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]
    if tcp:
        argv += ["--mca", "btl", "self,tcp"]
    if shim:
        argv += ["-x", "LD_PRELOAD", "-x", "RANKPACK_SHIM_DIR", "-x", "RANKPACK_SHIM_WAIT",
                 "-x", "RANKPACK_SHIM_YIELD_US"]  # fmt: skip
    argv += [solver, "-parallel"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(case / f"log.{solver}", "wb") as log:
        proc = subprocess.run(argv, cwd=case, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    status = "completed" if proc.returncode == 0 else f"exit {proc.returncode}"
    clock = clock_time(case / f"log.{solver}")
    result = {"status": status, "wall_s": wall, "clock_s": clock, "cpu_s": cpu}
    shutil.rmtree(run_dir)
    return result


def run_rankpack(work: Path, source: Path, ranks: int, iterations: int,
                 extra: list[str]) -> dict[str, object]:  # fmt: skip
    rankpack = os.environ.get("RANKPACK", str(Path(sys.executable).parent / "rankpack"))
    run_dir = Path(tempfile.mkdtemp(dir=work, prefix="rankpack-"))
    argv = [rankpack, "run", str(source), "--ranks", str(ranks), "--iterations",
            str(iterations), "--workdir", str(run_dir / "run"), "--json", *extra]  # fmt: skip
    log = run_dir / "run" / "log.simpleFoam"
    watch = FirstLine(lambda: log if log.exists() else None)
    watch.start()
    proc = subprocess.run(argv, capture_output=True, text=True)
    watch.stop.set()
    at = decided(Path(os.environ["RANKPACK_DB"]))
    startup = None if watch.at is None or at is None else round(watch.at - at, 3)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        shutil.rmtree(run_dir)
        return {"status": f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}",
                "wall_s": None, "clock_s": None, "cpu_s": None}  # fmt: skip
    logs = sorted((run_dir / "run").glob("log.*Foam"))
    result = {"status": out.get("status"), "wall_s": out.get("wall_s"),
              "clock_s": clock_time(logs[0]) if logs else None,
              "cpu_s": sum(r.get("cpu_s") or 0 for r in out.get("ranks", [])),
              "startup_s": startup, "solver_s": solver_s(watch)}  # fmt: skip
    shutil.rmtree(run_dir)
    return result


def one(config: str, work: Path, source: Path, decomposed: Path, ranks: int,
        iterations: int) -> dict[str, object]:  # fmt: skip
    if config == "plain":
        return run_plain(work, decomposed, ranks, shim=False)
    if config == "shim":
        return run_plain(work, decomposed, ranks, shim=True)
    if config == "plain-tcp":
        return run_plain(work, decomposed, ranks, shim=False, tcp=True)
    if config == "k8s-sim-w":
        return run_simulation(source, ranks, iterations)
    kubeconfig = os.environ.get("RANKPACK_BENCH_KUBECONFIG", DEV_KUBECONFIG)
    k8s = ["--backend", "kubernetes", "--kubeconfig", kubeconfig, "--allocatable", "2"]
    extra = {"rankpack": [], "rankpack-nocg": ["--no-cgroups"],
             "rankpack-noshim": ["--no-shim"], "rankpack-w": WEIGHTED,
             "rankpack-wd": [*WEIGHTED, "--resize", "duty"],
             "k8s-run-w": WEIGHTED + k8s}[config]  # fmt: skip
    return run_rankpack(work, source, ranks, iterations, extra)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def numbers(runs: list[dict[str, object]], key: str) -> list[float]:
    """The runs' ``key`` values, those that have one."""
    return [float(r[key]) for r in runs if r.get(key) is not None]  # type: ignore[arg-type]


def summary(runs: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for case in sorted({str(r["case"]) for r in runs}):
        plain = {r["rep"]: r["wall_s"] for r in runs if r["case"] == case
                 and r["config"] == "plain" and r["status"] == "completed"}  # fmt: skip
        for config in CONFIGS + OPTIONAL:
            mine = [r for r in runs if r["case"] == case and r["config"] == config
                    and r["status"] == "completed"]  # fmt: skip
            if not mine:
                continue
            walls = [float(r["wall_s"]) for r in mine]  # type: ignore[arg-type]
            clocks = [float(r["clock_s"]) for r in mine if r["clock_s"] is not None]  # type: ignore[arg-type]
            ratios = [float(r["wall_s"]) / float(plain[r["rep"]])  # type: ignore[arg-type]
                      for r in mine if r["rep"] in plain]  # fmt: skip
            out[f"{case}/{config}"] = {
                "n": len(mine),
                "wall_s": spread(walls),
                "clock_s": spread(clocks),
                "vs_plain": spread(ratios),
                "startup_s": spread(numbers(mine, "startup_s")),
                "solver_s": spread(numbers(mine, "solver_s")),
            }
            if config.startswith("k8s-"):  # pair by pair with the same settings run locally
                for local_config, suffix in (("rankpack-w", ""), ("rankpack-wd", "_duty")):
                    local = {r["rep"]: r for r in runs if r["case"] == case
                             and r["config"] == local_config
                             and r["status"] == "completed"}  # fmt: skip
                    pairs = [(r, local[r["rep"]]) for r in mine if r["rep"] in local]
                    if pairs:
                        out[f"{case}/{config}"].update(_against_local(pairs, suffix))
    return out


def _against_local(pairs: list[tuple[dict[str, object], dict[str, object]]],
                   suffix: str) -> dict[str, object]:  # fmt: skip
    """A Kubernetes configuration's wall, start-up and solver against a local one, pair by pair."""
    return {
        f"vs_local{suffix}": spread(
            [float(k["wall_s"]) / float(lo["wall_s"]) for k, lo in pairs]  # type: ignore[arg-type]
        ),
        f"startup_above_local{suffix}_s": spread(
            [
                float(k["startup_s"]) - float(lo["startup_s"])  # type: ignore[arg-type]
                for k, lo in pairs
                if k.get("startup_s") is not None and lo.get("startup_s") is not None
            ]
        ),
        f"solver_vs_local{suffix}": spread(
            [
                float(k["solver_s"]) / float(lo["solver_s"])  # type: ignore[arg-type]
                for k, lo in pairs
                if k.get("solver_s") and lo.get("solver_s")
            ]
        ),
    }


def run_case(work: Path, case: str, configs: list[str], reps: int,
             ranks: int) -> list[dict[str, object]]:  # fmt: skip
    """Every configuration of one case, ``reps`` times, alternated (the order rotates)."""
    runs: list[dict[str, object]] = []
    source, decomposed, iterations = prepare(work, case, ranks)
    for rep in range(reps):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
        for config in order:
            r = one(config, work, source, decomposed, ranks, iterations)
            r.update(case=case, config=config, rep=rep)
            runs.append(r)
            print(json.dumps(r), flush=True)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--cases", default="user,pitzDaily")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path,
                    default=HERE / "results" / f"cost-{date.today().isoformat()}.json")  # fmt: skip
    args = ap.parse_args()
    cases = args.cases.split(",")
    configs = args.configs.split(",")
    known = CONFIGS + OPTIONAL
    if bad := [c for c in cases if c not in CASES] + [c for c in configs if c not in known]:
        print(f"cost.py: unknown {bad}: cases {list(CASES)}, configs {list(known)}",
              file=sys.stderr)  # fmt: skip
        return 2
    work = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="rankpack-cost-"))
    os.environ["RANKPACK_HOME"] = str(work / "home")
    os.environ["RANKPACK_DB"] = str(work / "cost.db")
    runs: list[dict[str, object]] = []
    try:
        for case in cases:
            runs += run_case(work, case, configs, args.reps, args.ranks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"command": " ".join(sys.argv), "ranks": args.ranks, "runs": runs,
              "summary": summary(runs)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'case/config':<28} {'n':>2}  {'wall_s':<24} {'ClockTime':<24} vs plain")
    for key, s in result["summary"].items():  # type: ignore[union-attr]
        print(f"{key:<28} {s['n']:>2}  {s['wall_s']:<24} {s['clock_s']:<24} {s['vs_plain']}")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
