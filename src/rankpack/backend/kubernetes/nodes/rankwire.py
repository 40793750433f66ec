"""The wire form of a rank's reading in ``GET /v1/ranks``: the node agent writes it
(`reading_json`), the backend's client of the agents reads it back (`reading_from_json`,
checked: the answer is not trusted). One entry per rank, so several per group pod.
"""

from __future__ import annotations

from typing import Any

from rankpack.backend.kubernetes.nodes.nodereader import (
    CpuCounters,
    NodeRankReading,
    Pressure,
    RankPod,
)
from rankpack.backend.mpirun import ShimSample

Obj = dict[str, Any]


def reading_json(who: RankPod, reading: NodeRankReading) -> Obj:
    """One rank's entry in ``/v1/ranks`` (counters null when not known: `NodeRankReading`)."""
    cpu, psi, shim = reading.cpu, reading.psi, reading.shim
    return {
        "namespace": who.namespace,
        "pod": who.name,
        "uid": who.uid,
        "sim": who.sim,
        "rank": who.rank,
        "usage_ns": cpu.usage_ns if cpu else None,
        "nr_throttled": cpu.nr_throttled if cpu else None,
        "throttled_ns": cpu.throttled_ns if cpu else None,
        "psi": None if psi is None else {
            "some_avg10": psi.some_avg10, "some_total_us": psi.some_total_us,
            "full_avg10": psi.full_avg10, "full_total_us": psi.full_total_us,
        },
        "shim": None if shim is None else {
            "compute_ns": shim.compute_ns, "mpi_ns": shim.mpi_ns,
            "duty_window": shim.duty_window, "wait_mode": shim.wait_mode,
        },
    }  # fmt: skip


def reading_from_json(entry: Obj) -> NodeRankReading:
    """The reading of one ``/v1/ranks`` entry; ValueError if it does not have the shape
    `reading_json` gives (the answer is checked, not trusted)."""
    if not isinstance(entry, dict):
        raise ValueError("a rank entry is not an object")
    cpu = None
    if entry.get("usage_ns") is not None:
        cpu = CpuCounters(_int(entry["usage_ns"]), _int(entry.get("nr_throttled") or 0),
                          _int(entry.get("throttled_ns") or 0))  # fmt: skip
    psi = None
    p = entry.get("psi")
    if isinstance(p, dict):
        psi = Pressure(
            _float(p.get("some_avg10")),
            _int(p.get("some_total_us")),
            _opt(_float, p.get("full_avg10")),
            _opt(_int, p.get("full_total_us")),
        )
    shim = None
    sh = entry.get("shim")
    if isinstance(sh, dict):
        mode = sh.get("wait_mode")
        shim = ShimSample(_opt(_int, sh.get("compute_ns")), _opt(_int, sh.get("mpi_ns")),
                          _opt(_float, sh.get("duty_window")),
                          str(mode) if mode is not None else None)  # fmt: skip
    return NodeRankReading(cpu, psi, shim)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a counter")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _opt(kind: Any, value: Any) -> Any:
    return None if value is None else kind(value)
