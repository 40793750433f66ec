"""Helpers of the Kubernetes backend's unit tests: a Node object and a simulation's spec
(see `tests.fakeapi` for the apiserver fake, `fakenode` for a node's filesystems)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankpack.backend.protocol import RankResources, SimSpec

CASE = Path("/runs/r1")
"""The case directory of `sim_spec`."""


def node_object(name: str, ready: str = "True") -> dict[str, Any]:
    """A Node with 4 CPUs allocatable and its Ready condition."""
    return {"metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready}],
                       "allocatable": {"cpu": "4"}}}  # fmt: skip


def sim_spec(**kw: Any) -> SimSpec:
    """Simulation ``s1`` of two ranks in `CASE` (``kw``: fields to change)."""
    base: dict[str, Any] = {
        "sim_id": "s1",
        "case_dir": CASE,
        "command": ("simpleFoam", "-parallel"),
        "ranks": (RankResources(250), RankResources(1250, 1500)),
        "log_path": CASE / "log.simpleFoam",
        "labels": {"rankpack.dev/run-id": "7"},
    }
    base.update(kw)
    return SimSpec(**base)
