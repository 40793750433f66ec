#!/usr/bin/env python3
"""Issue 29's scale benchmark: the one control loop on a simulated cluster of many nodes.

Runs `rankpack.controller.loop.run_jobs` - the loop the operator runs, with its settings
(`launch_must_fit`, wait ``auto``, staged ahead, duty-cycle sizing) - on the simulated
backend (`rankpack.testing.simulated`, virtual time) with N nodes of ``--cores`` cores and
M simulations of R ranks (``--ranks 16-64``: each simulation's count drawn from that range),
all submitted at virtual time 0, and an apiserver cost model (`rankpack.testing.simapi`:
the requests the Kubernetes backend would make, a latency per request and a
requests-per-second limit, which delay what the requests do).

Workload (deterministic for a ``--seed``): simulation k computes ``--cells-per-rank`` cells
per rank for as many iterations as make it run ``--alone-s`` LO-HI virtual seconds alone
(one core per rank; drawn per simulation), with ``--mpi-s`` seconds of communication per
iteration (its duty cycle is ``1 - mpi_s / iteration_s``, 0.95 by default).

Printed (``--json``: one JSON object) per configuration:

* ``fill_at_5min``: requested / allocatable cores 5 virtual minutes after submission (the
  requests of every rank pod pending or running); ``fill_series``: [t_s, fill] per tick;
* ``makespan_s`` and ``makespan_over_bound``: the last end against the work-conserving
  lower bound, the larger of all simulations' CPU work (compute) / the cluster's cores and
  the longest simulation alone (staging and start included);
* ``fifo_ideal_over_bound`` and ``lpt_ideal_over_bound``: what an ideal scheduler of rigid
  simulations reaches against the same bound on the same workload (`ideal_makespan`: every
  rank one core, packed on the cluster's cores without node boundaries, started the moment
  cores are free, staging and start included) in submission order and longest-first;
  ``makespan_over_fifo_ideal``: the loop's makespan against the first. The work-conserving
  bound assumes work that can be spread over any number of cores; a rank cannot, so a queue
  1.6 waves deep of 600-1 200 s simulations cannot reach it in any order;
* ``tick_p50_ms``, ``tick_p99_ms``, ``tick_max_ms``: real time of one loop iteration (from
  the return of the backend's ``wait`` to its next call: observe, record, decide, apply),
  less the garbage collection the loop does between ticks just before it waits
  (`rankpack.controller.loop.Collector`; reported apart as ``gc_between_ticks``, and
  counted in ``tick_p50_ms_with_gc``, ``tick_p99_ms_with_gc``); ``tick_cpu_p50_ms``,
  ``tick_cpu_p99_ms``: the same ticks' CPU time (the loop's thread: its own cost, without
  the time other processes of a shared machine took the cores);
  ``tick_p50_ms_at_max_ranks``: the same over the ticks with at least 90 % of
  ``live_ranks_max`` live;
* ``live_ranks_max``: most rank pods pending or running at once;
* ``api_requests_per_min``: apiserver requests per virtual minute over the makespan (and
  ``api_requests`` by kind); ``simulations_running_mean``: the mean number of simulations
  with rank pods over the makespan (requests per running simulation =
  ``api_requests_per_min / simulations_running_mean``);
* ``most_running``, ``completed``, ``failed``, ``resizes``;
* ``actions`` and ``actions_digest``: how many calls changed the cluster (stage, launch,
  resize, wait mode, stop, release) and a SHA-256 over them in order with their virtual
  time and arguments: two runs of one configuration made the same decisions iff equal.

  PYTHONPATH=src .venv/bin/python bench/scale.py --nodes 1000 --sims 200 --ranks 64 --json
  PYTHONPATH=src .venv/bin/python bench/scale.py --sweep --json > bench/results/scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import heapq
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rankpack.controller import loop as loop_module
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import Job
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.core.failures import Failure, FailureCode
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

try:  # the apiserver cost model (absent from a tree older than issue 29)
    from rankpack.testing.simapi import ApiModel
except ImportError:  # pragma: no cover - only when measuring an older controller
    ApiModel = None  # type: ignore[assignment,misc]

FIVE_MIN_S = 300.0

SWEEP: tuple[tuple[int, int, str], ...] = (
    (10, 5, "16"),
    (100, 20, "16"),
    (100, 50, "64"),
    (300, 100, "16-64"),
    (1000, 200, "64"),
    (1000, 500, "16-64"),
)
"""(nodes, simulations, ranks) of ``--sweep``: the issue's table, then up to 500
simulations of 16-64 ranks on 1 000 nodes."""


@dataclass(frozen=True)
class Config:
    nodes: int
    sims: int
    ranks: str
    cores: int = 8
    seed: int = 29
    alone_s: tuple[float, float] = (600.0, 1200.0)
    iteration_s: float = 2.0
    mpi_s: float = 0.1
    cells_per_rank: int = 10_000
    api_latency_ms: float = 5.0
    api_rps: float = 100.0
    reads: str = "watch"
    tick_s: float = 1.0
    max_virtual_s: float = 6 * 3600.0
    controller: dict[str, Any] = field(default_factory=dict)


@dataclass
class SimJob:
    job: Job
    work_cpu_s: float
    alone_s: float


class ListQueue:
    """Every simulation submitted at t = 0, in order (the operator's queue, in memory)."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.waiting: dict[int, Job] = {j.queue_id: j for j in jobs}
        self.finished_status: dict[int, str] = {}

    def pending(self) -> list[Job]:
        return list(self.waiting.values())

    def claim(self, job: Job) -> bool:
        return self.waiting.pop(job.queue_id, None) is not None

    def started(self, job: Job, run_id: int, sim_id: str, staged: object) -> None:
        pass

    def finished(
        self, job: Job, status: str, message: str = "", failure: FailureCode | None = None
    ) -> None:
        if status == "queued":
            self.waiting[job.queue_id] = job
            return
        self.finished_status[job.queue_id] = status

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        pass

    def held(self, job: Job, code: str, reason: str) -> None:
        pass

    def withdrawn(self) -> set[int]:
        return set()

    def requeued(self, job: Job, why: Failure) -> None:
        self.waiting = {job.queue_id: job, **self.waiting}


class Measured:
    """The simulated backend, timed: a tick is the real time between two ``wait`` calls
    (what the loop does between them); at each ``wait`` the cluster's fill is sampled
    (outside the tick's time)."""

    def __init__(self, backend: SimulatedBackend, cores_millis: int, stop_after_s: float) -> None:
        self.inner = backend
        self.halt = threading.Event()
        self.stop_after_s = stop_after_s
        self.cluster = backend.cluster
        self.cores_millis = cores_millis
        self.name = backend.name
        self.ticks_ms: list[float] = []
        self.ticks_with_gc_ms: list[float] = []
        """The same ticks with the loop's garbage collection between ticks counted in."""
        self.gc_ms: list[float] = []
        """Each collection the loop made between ticks (`loop.Collector`)."""
        self._gc_in_tick = 0.0
        self.ticks_cpu_ms: list[float] = []
        """The same ticks' CPU time (this thread's: what the loop itself cost, whatever else
        the machine ran meanwhile), less the collections between ticks."""
        self._gc_cpu_in_tick = 0.0
        self._cpu_since = time.thread_time()
        self.tick_ranks: list[int] = []
        self.fill: list[tuple[float, float]] = []
        self.running: list[tuple[float, int]] = []
        self.live_ranks_max = 0
        self._since = time.perf_counter()
        self._trace = hashlib.sha256()
        self.actions = 0
        self._case: dict[str, str] = {}

    def _act(self, *what: object) -> None:
        """One call that changes the cluster, into ``actions_digest`` (virtual time, the
        case's name for the simulation's random id): the regression check that a change to
        the controller's speed did not change a decision."""
        self.actions += 1
        self._trace.update(repr((round(self.cluster.now, 6), *what)).encode())

    def digest(self) -> str:
        return self._trace.hexdigest()

    def stage(self, spec: Any) -> None:
        self._case[spec.sim_id] = spec.case
        self._act("stage", spec.case, spec.n_ranks, spec.decompose_weights)
        self.inner.stage(spec)

    def launch(self, spec: Any) -> None:
        self._act("launch", self._case.get(spec.sim_id), spec.ranks, spec.shim,
                  tuple(sorted(spec.placement.items())), spec.rank_nodes)  # fmt: skip
        self.inner.launch(spec)

    def resize(self, sim_id: str, rank: int, resources: Any) -> Any:
        status = self.inner.resize(sim_id, rank, resources)
        self._act("resize", self._case.get(sim_id), rank, resources, status.state)
        return status

    def set_wait_mode(self, sim_id: str, mode: str) -> None:
        self._act("wait_mode", self._case.get(sim_id), mode)
        self.inner.set_wait_mode(sim_id, mode)

    def stop(self, sim_id: str) -> None:
        self._act("stop", self._case.get(sim_id))
        self.inner.stop(sim_id)

    def release(self, sim_id: str) -> None:
        self._act("release", self._case.get(sim_id))
        self.inner.release(sim_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def collected(self, ms: float, cpu_ms: float) -> None:
        """The loop collected garbage between ticks for ``ms`` (``cpu_ms`` of CPU), just
        before this wait."""
        self.gc_ms.append(ms)
        self._gc_in_tick += ms
        self._gc_cpu_in_tick += cpu_ms

    def wait(self, timeout_s: float) -> None:
        whole = (time.perf_counter() - self._since) * 1000
        self.ticks_cpu_ms.append((time.thread_time() - self._cpu_since) * 1000
                                 - self._gc_cpu_in_tick)  # fmt: skip
        self.ticks_with_gc_ms.append(whole)
        self.ticks_ms.append(whole - self._gc_in_tick)
        self._gc_in_tick = self._gc_cpu_in_tick = 0.0
        inventory = self.cluster.inventory()  # cached by the cluster while nothing changes
        requested = sum(n.requested_millis for n in inventory.nodes)
        ranks = sum(n.rank_pods for n in inventory.nodes)
        sims = sum(1 for sim in self.cluster._sims.values() if sim.active)
        self.tick_ranks.append(ranks)
        self.live_ranks_max = max(self.live_ranks_max, ranks)
        now = self.cluster.now
        self.fill.append((now, requested / self.cores_millis))
        self.running.append((now, sims))
        if now >= self.stop_after_s:
            self.halt.set()  # the loop stops what runs and ends
        self.inner.wait(timeout_s)
        self._since = time.perf_counter()
        self._cpu_since = time.thread_time()


def _ranks(spec: str, rng: random.Random) -> int:
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-", 1))
        return rng.randint(lo, hi)
    return int(spec)


def workload(cfg: Config) -> tuple[list[SimulatedCase], list[SimJob]]:
    rng = random.Random(cfg.seed)
    cases, jobs = [], []
    compute_s = cfg.iteration_s - cfg.mpi_s
    cell_work_s = compute_s / cfg.cells_per_rank
    for k in range(cfg.sims):
        n = _ranks(cfg.ranks, rng)
        alone = rng.uniform(*cfg.alone_s)
        iterations = max(10, round(alone / cfg.iteration_s))
        case = SimulatedCase(
            f"w{k}", cells=n * cfg.cells_per_rank, iterations=iterations,
            cell_work_s=cell_work_s, mpi_s_per_iteration=cfg.mpi_s,
        )  # fmt: skip
        cases.append(case)
        sub = Submission(case=case.name, weights=(1.0,) * n, budget_millis=1000 * n)
        jobs.append(SimJob(Job(k + 1, sub), n * compute_s * iterations,
                           iterations * cfg.iteration_s))  # fmt: skip
    return cases, jobs


def ideal_makespan(durations: Sequence[float], widths: Sequence[int], cores: int,
                   order: Sequence[int]) -> float:  # fmt: skip
    """The makespan of list scheduling rigid jobs (``widths[j]`` cores for ``durations[j]``)
    on ``cores`` interchangeable cores: the next job in ``order`` starts the moment enough
    cores are free (no job overtakes the one waiting first). A job wider than the cluster
    never starts: inf."""
    if any(widths[j] > cores for j in order):
        return math.inf
    free, now = cores, 0.0
    waiting = list(order)
    running: list[tuple[float, int]] = []
    while waiting or running:
        while waiting and widths[waiting[0]] <= free:
            j = waiting.pop(0)
            free -= widths[j]
            heapq.heappush(running, (now + durations[j], j))
        now, j = heapq.heappop(running)  # ends come out in order: the last is the makespan
        free += widths[j]
    return now


def ideal_references(jobs: Sequence[SimJob], cores: int, overhead_s: float) -> dict[str, float]:
    """`ideal_makespan` of the workload in submission order and longest-first."""
    durations = [j.alone_s + overhead_s for j in jobs]
    widths = [math.ceil(j.job.submission.budget_millis / 1000) for j in jobs]
    fifo = ideal_makespan(durations, widths, cores, range(len(jobs)))
    lpt_order = sorted(range(len(jobs)), key=lambda k: (-durations[k] * widths[k], k))
    return {"fifo": fifo, "lpt": ideal_makespan(durations, widths, cores, lpt_order)}


def run(cfg: Config) -> dict[str, Any]:
    cases, jobs = workload(cfg)
    cores_millis = cfg.nodes * cfg.cores * 1000
    nodes = tuple(SimNode(f"n{i:04d}", cfg.cores * 1000) for i in range(cfg.nodes))
    timing = SimTiming(stage_s=2.0, start_s=5.0, resize_latency_s=1.0)
    extra: dict[str, Any] = {}
    api = None
    if ApiModel is not None:
        api = ApiModel(latency_s=cfg.api_latency_ms / 1000, rps=cfg.api_rps, reads=cfg.reads)
        extra["api"] = api
    cluster = SimulatedCluster(nodes=nodes, cases=tuple(cases), timing=timing,
                               create_run_dirs=False, **extra)  # fmt: skip
    backend = Measured(SimulatedBackend(cluster), cores_millis, cfg.max_virtual_s)
    controller = replace(
        ControllerSettings(max_concurrent=cfg.sims, launch_must_fit=True), **cfg.controller
    )
    # the store in memory when it can be: a tick's cost without the disk's fsyncs
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="rankpack-scale-", dir=shm) as tmp:
        store = Store(Path(tmp) / "scale.db")
        settings = LoopSettings(runs_root=Path(tmp) / "runs", controller=controller,
                                wait_mode="auto", tick_s=cfg.tick_s, leave_running=False,
                                label="scale")  # fmt: skip
        queue = ListQueue([j.job for j in jobs])
        started = time.perf_counter()
        with _timed_collections(backend):
            result = run_jobs(backend, store, queue, settings,  # type: ignore[arg-type]
                              stop=backend.halt)  # fmt: skip
        real_s = time.perf_counter() - started
        store.conn.close()
    ends = [o.finished_s for o in result.outcomes]
    stopped = result.status != "completed"
    makespan = math.inf if stopped or not ends else max(ends)
    overhead = timing.stage_s + timing.start_s
    bound = max(
        sum(j.work_cpu_s for j in jobs) / (cores_millis / 1000),
        max(j.alone_s for j in jobs) + overhead,
    )
    ideal = ideal_references(jobs, cores_millis // 1000, overhead)
    ticks = backend.ticks_ms[1:]  # the first "tick" is the loop's set-up
    with_gc = backend.ticks_with_gc_ms[1:]
    ranks = backend.tick_ranks[1:]
    busy = [t for t, r in zip(ticks, ranks, strict=True)
            if r >= 0.9 * backend.live_ranks_max]  # fmt: skip
    fill5 = _at(backend.fill, FIVE_MIN_S)
    running = [(t, n) for t, n in backend.running if t <= makespan]
    requests = api.counts() if api is not None else {}
    total_requests = sum(requests.values())
    span = backend.running[-1][0] if stopped and backend.running else makespan
    return {
        "nodes": cfg.nodes,
        "cores_per_node": cfg.cores,
        "sims": cfg.sims,
        "ranks": cfg.ranks,
        "seed": cfg.seed,
        "fill_at_5min": round(fill5, 4),
        "makespan_s": round(makespan, 1) if not stopped else None,
        "stopped_at_s": round(span, 1) if stopped else None,
        "bound_s": round(bound, 1),
        "makespan_over_bound": round(makespan / bound, 3) if not stopped else None,
        "fifo_ideal_over_bound": round(ideal["fifo"] / bound, 3),
        "lpt_ideal_over_bound": round(ideal["lpt"] / bound, 3),
        "makespan_over_fifo_ideal": round(makespan / ideal["fifo"], 3) if not stopped else None,
        "tick_p50_ms": round(_pct(ticks, 50), 2),
        "tick_p99_ms": round(_pct(ticks, 99), 2),
        "tick_max_ms": round(max(ticks, default=0.0), 2),
        "tick_p50_ms_at_max_ranks": round(_pct(busy, 50), 2),
        "tick_p99_ms_at_max_ranks": round(_pct(busy, 99), 2),
        "ticks": len(ticks),
        "tick_cpu_p50_ms": round(_pct(backend.ticks_cpu_ms[1:], 50), 2),
        "tick_cpu_p99_ms": round(_pct(backend.ticks_cpu_ms[1:], 99), 2),
        "tick_p50_ms_with_gc": round(_pct(with_gc, 50), 2),
        "tick_p99_ms_with_gc": round(_pct(with_gc, 99), 2),
        "gc_between_ticks": {
            "collections": len(backend.gc_ms),
            "p50_ms": round(_pct(backend.gc_ms, 50), 2),
            "p99_ms": round(_pct(backend.gc_ms, 99), 2),
            "max_ms": round(max(backend.gc_ms, default=0.0), 2),
            "total_s": round(sum(backend.gc_ms) / 1000, 2),
        },
        "live_ranks_max": backend.live_ranks_max,
        "api_requests": requests,
        "api_requests_per_min": round(total_requests / (span / 60), 1) if requests else None,
        "simulations_running_mean": round(_time_mean(running, span), 2),
        "most_running": max((n for _, n in backend.running), default=0),
        "completed": sum(1 for r in result.results if r.status == "completed"),
        "failed": sum(1 for r in result.results if r.status != "completed")
        + len(result.stage_failures),
        "resizes": result.resizes,
        "actions": backend.actions,
        "actions_digest": backend.digest(),
        "real_s": round(real_s, 1),
        "api": {"latency_ms": cfg.api_latency_ms, "rps": cfg.api_rps, "reads": cfg.reads},
        "workload": {"alone_s": list(cfg.alone_s), "iteration_s": cfg.iteration_s,
                     "mpi_s": cfg.mpi_s, "cells_per_rank": cfg.cells_per_rank},
        "fill_series": _thin(backend.fill),
    }  # fmt: skip


@contextlib.contextmanager
def _timed_collections(backend: Measured) -> Iterator[None]:
    """Time the loop's garbage collections between ticks (`Collector.between_ticks`, just
    before it waits): reported apart (``gc_between_ticks``) and left out of ``ticks_ms``,
    kept in ``tick_*_with_gc``. (None on a tree older than the collector.)"""
    collector = getattr(loop_module, "Collector", None)
    if collector is None:
        yield
        return
    between = collector.between_ticks

    def timed(self: Any) -> None:
        before, t, cpu = self.collections, time.perf_counter(), time.thread_time()
        between(self)
        if self.collections != before:
            backend.collected((time.perf_counter() - t) * 1000,
                              (time.thread_time() - cpu) * 1000)  # fmt: skip

    collector.between_ticks = timed
    try:
        yield
    finally:
        collector.between_ticks = between


def _at(series: list[tuple[float, float]], t: float) -> float:
    value = 0.0
    for ts, v in series:
        if ts > t:
            break
        value = v
    return value


def _pct(values: Sequence[float], p: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] if p < 100 else (
        max(values))  # fmt: skip


def _time_mean(series: list[tuple[float, int]], end: float) -> float:
    if not series or end <= 0 or not math.isfinite(end):
        return 0.0
    total = 0.0
    for (t0, n), (t1, _) in zip(series, [*series[1:], (end, 0)], strict=True):
        total += n * max(0.0, min(t1, end) - t0)
    return total / end


def _thin(series: list[tuple[float, float]], step_s: float = 10.0) -> list[list[float]]:
    out: list[list[float]] = []
    for t, v in series:
        if not out or t - out[-1][0] >= step_s:
            out.append([round(t, 1), round(v, 4)])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--cores", type=int, default=8, help="cores per node (8)")
    p.add_argument("--sims", type=int, default=5)
    p.add_argument("--ranks", default="16", help="ranks per simulation: R or LO-HI (16)")
    p.add_argument("--seed", type=int, default=29)
    p.add_argument("--alone-s", default="600-1200", help="run time alone, LO-HI virtual s")
    p.add_argument("--mpi-s", type=float, default=0.1, help="MPI s per 2 s iteration (0.1)")
    p.add_argument("--max-virtual-s", type=float, default=6 * 3600.0,
                   help="stop the loop after this many virtual seconds (6 h)")  # fmt: skip
    p.add_argument("--api-latency-ms", type=float, default=5.0)
    p.add_argument("--api-rps", type=float, default=100.0)
    p.add_argument("--reads", choices=("watch", "poll"), default="watch",
                   help="the backend's reads: a watch cache, or polled")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a ControllerSettings field (repeatable)")  # fmt: skip
    p.add_argument("--sweep", action="store_true", help="run the sweep (SWEEP)")
    p.add_argument("--plot", type=Path, help="draw fill over time of every run into this PNG")
    p.add_argument("--replot", type=Path, metavar="JSON",
                   help="draw --plot from results written before (no run)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON (a list with --sweep)")
    args = p.parse_args(argv)
    lo, hi = (float(x) for x in args.alone_s.split("-", 1))
    controller = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    base = Config(nodes=args.nodes, sims=args.sims, ranks=args.ranks, cores=args.cores,
                  seed=args.seed, alone_s=(lo, hi), mpi_s=args.mpi_s,
                  api_latency_ms=args.api_latency_ms, api_rps=args.api_rps, reads=args.reads,
                  max_virtual_s=args.max_virtual_s,
                  controller=controller)  # fmt: skip
    configs = (
        [replace(base, nodes=n, sims=m, ranks=r) for n, m, r in SWEEP] if args.sweep else [base]
    )
    results = []
    if args.replot is not None:
        loaded = json.loads(args.replot.read_text())
        results = loaded if isinstance(loaded, list) else [loaded]
        configs = []
    for cfg in configs:
        out = run(cfg)
        results.append(out)
        if not args.json:
            shown = {k: v for k, v in out.items() if k not in ("fill_series",)}
            print(json.dumps(shown), file=sys.stderr, flush=True)
    if args.plot is not None:
        from rankpack.report.figures import scale_fill_png

        args.plot.write_bytes(scale_fill_png(results))
    if args.json:
        print(json.dumps(results if args.sweep else results[0], indent=1))
    return 0


def _value(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


if __name__ == "__main__":
    raise SystemExit(main())
