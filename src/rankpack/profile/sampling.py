"""Sample the live records of a running MPI job and summarise them per rank.

Solver-agnostic: the caller starts the job (any backend) with `shim_env(...)`, then calls
`sample_live` with a way to wait for the job's end, and `summarise` with each rank's CPU
request. Used by `rankpack profile -- PROGRAM` and `rankpack profile CASE | --attach`
(`rankpack.cli.profile_cmd`, `rankpack.cli.profile_case`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.profile.duty import Counters, duty_between, reclaimable_millis, steady_state_start
from rankpack.profile.records import RankRecord, RecordReader, record_path

DEFAULT_SAMPLE_S = 10.0
"""How long `rankpack profile` samples a program or an attached run unless given --seconds."""


def sample_live(
    live_dir: Path,
    n_ranks: int,
    *,
    seconds: float,
    wait_for_exit: Callable[[float], bool],
    interval_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> dict[int, list[RankRecord]]:
    """Snapshots of every rank about every `interval_s`, until `seconds` pass or the job ends.

    `wait_for_exit(timeout_s)` blocks up to `timeout_s` and returns True once the job has
    ended (e.g. ``lambda t: backend.wait(handle, t) is not None``). A last snapshot is taken
    after the end, so a finished job's final counters are included. Only new versions of a
    record are kept.
    """
    history: dict[int, list[RankRecord]] = {r: [] for r in range(n_ranks)}
    readers = [RecordReader(record_path(live_dir, r)) for r in range(n_ranks)]
    deadline = clock() + seconds
    try:
        while True:
            take_snapshots(readers, history)
            remaining = deadline - clock()
            if remaining <= 0:
                break
            if wait_for_exit(min(interval_s, remaining)):
                break
        take_snapshots(readers, history)
    finally:
        for reader in readers:
            reader.close()
    return history


def take_snapshots(readers: Sequence[RecordReader], history: dict[int, list[RankRecord]]) -> None:
    for rank, reader in enumerate(readers):
        rec = reader.snapshot()
        if rec is None:
            continue
        seen = history[rank]
        if seen and (rec.pid != seen[-1].pid or rec.updates < seen[-1].updates):
            seen.clear()  # a new process reuses the file: keep only the newest run
        if not seen or rec.updates != seen[-1].updates:
            seen.append(rec)


@dataclass(frozen=True)
class RankProfile:
    rank: int
    duty: float | None
    """Steady-state duty cycle (seed 001 eq. 2); None if the rank never reported."""
    compute_s: float
    """Compute time in the steady-state span."""
    mpi_s: float
    """Time in intercepted MPI calls in the steady-state span."""
    span_s: float
    request_millis: float
    reclaimable_millis: float
    calls: Mapping[str, int]
    """Cumulative calls per MPI function (functions never called are left out)."""


@dataclass(frozen=True)
class ProfileSummary:
    ranks: tuple[RankProfile, ...]
    reclaimable_millis_total: float
    skip_fraction: float

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": [
                {
                    "rank": r.rank,
                    "duty": None if r.duty is None else round(r.duty, 4),
                    "compute_s": round(r.compute_s, 6),
                    "mpi_s": round(r.mpi_s, 6),
                    "span_s": round(r.span_s, 6),
                    "request_millis": r.request_millis,
                    "reclaimable_millis": round(r.reclaimable_millis, 1),
                    "calls": dict(r.calls),
                }
                for r in self.ranks
            ],
            "reclaimable_millis_total": round(self.reclaimable_millis_total, 1),
            "skip_fraction": self.skip_fraction,
        }


def counters(history: Sequence[RankRecord]) -> list[Counters]:
    """The rank's cumulative counters, starting with zeros at MPI_Init."""
    if not history:
        return []
    first = history[0]
    return [Counters(first.t_start_ns, 0, 0)] + [
        Counters(r.t_update_ns, r.compute_ns, r.mpi_ns) for r in history
    ]


def summarise(
    history: Mapping[int, Sequence[RankRecord]],
    requests_millis: Sequence[float],
    skip_fraction: float = 0.1,
) -> ProfileSummary:
    """Per-rank steady-state duty, times and reclaimable CPU (eq. 3) from `sample_live` output.

    The steady-state span runs from the first sample after `skip_fraction` of the sampled
    time to the last sample; with too few samples it falls back to the whole run.
    """
    ranks: list[RankProfile] = []
    for rank, request in enumerate(requests_millis):
        samples = counters(history.get(rank, []))
        if len(samples) < 2:
            ranks.append(RankProfile(rank, None, 0.0, 0.0, 0.0, request, 0.0, {}))
            continue
        start = steady_state_start(samples, skip_fraction)
        if start >= len(samples) - 1:
            start = 0
        a, b = samples[start], samples[-1]
        duty = duty_between(a, b)
        last = history[rank][-1]
        ranks.append(
            RankProfile(
                rank=rank,
                duty=duty,
                compute_s=(b.compute_ns - a.compute_ns) / 1e9,
                mpi_s=(b.mpi_ns - a.mpi_ns) / 1e9,
                span_s=(b.t_ns - a.t_ns) / 1e9,
                request_millis=request,
                reclaimable_millis=0.0,
                calls={f.name: f.calls for f in last.funcs if f.calls},
            )
        )
    per_rank, total = reclaimable_millis(requests_millis, [r.duty for r in ranks])
    ranks = [
        RankProfile(r.rank, r.duty, r.compute_s, r.mpi_s, r.span_s, r.request_millis, c, r.calls)
        for r, c in zip(ranks, per_rank, strict=True)
    ]
    return ProfileSummary(tuple(ranks), total, skip_fraction)
