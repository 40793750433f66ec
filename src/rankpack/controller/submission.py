"""A job: one simulation to run, as `rankpack run` builds it and `rankpack submit` queues it.

The control loop stages and launches it; its plan (per-rank requests) comes from the
weights and budget. Stored as JSON in the queue (`to_json` / `from_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from rankpack.controller.observations import Phase
from rankpack.plan.allocation import Plan, QoS, make_plan


@dataclass(frozen=True)
class Submission:
    case: str
    weights: tuple[float, ...]
    budget_millis: int
    """Initial requests sum to this; sizing and fairness never exceed it."""
    floor_millis: int = 0
    iterations: int | None = None
    decompose: str = "equal"
    center: tuple[float, float, float] | None = None
    phases: tuple[Phase, ...] = ()
    decompose_weights: tuple[float, ...] = ()
    """Weights of the decomposition (default: the CPU weights)."""
    qos: str = QoS.REQUESTS.value
    sizing: Literal["duty", "fixed"] = "duty"
    """duty: profile and size ranks to their duty cycles; fixed: keep the plan's requests."""
    workdir: str | None = None
    """An exact run directory instead of a new one under the data directory."""
    solver: str | None = None
    """The solver to run (default: the case's controlDict ``application``)."""
    wait: str | None = None
    """How its ranks wait in MPI: auto, spin, polite, adaptive (default: the session's)."""
    volume: str | None = None
    """Kubernetes: where the run directory lives in the rank pods (default: the session's)."""

    @property
    def n_ranks(self) -> int:
        return len(self.weights)

    def plan(self) -> Plan:
        plan = make_plan(
            list(self.weights), self.budget_millis, floor_millis=self.floor_millis,
            qos=QoS(self.qos),
        )  # fmt: skip
        if self.phases and self.phases[0].start_fraction == 0:
            # A schedule that starts at 0 sets the initial requests itself.
            ranks = tuple(
                replace(r, cpu_millis=m)
                for r, m in zip(plan.ranks, self.phases[0].request_millis, strict=True)
            )
            plan = replace(plan, ranks=ranks, total_millis=sum(self.phases[0].request_millis))
        return plan

    @property
    def initial_millis(self) -> tuple[int, ...]:
        return tuple(r.cpu_millis for r in self.plan().ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "weights": list(self.weights),
            "budget_millis": self.budget_millis,
            "floor_millis": self.floor_millis,
            "iterations": self.iterations,
            "decompose": self.decompose,
            "center": list(self.center) if self.center else None,
            "phases": [
                {"start_fraction": p.start_fraction, "request_millis": list(p.request_millis)}
                for p in self.phases
            ],
            "decompose_weights": list(self.decompose_weights),
            "qos": self.qos,
            "sizing": self.sizing,
            "workdir": self.workdir,
            "solver": self.solver,
            "wait": self.wait,
            "volume": self.volume,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Submission:
        center = d.get("center")
        sizing = d.get("sizing", "duty")
        return Submission(
            case=d["case"],
            weights=tuple(float(w) for w in d["weights"]),
            budget_millis=int(d["budget_millis"]),
            floor_millis=int(d.get("floor_millis", 0)),
            iterations=d.get("iterations"),
            decompose=d.get("decompose", "equal"),
            center=(float(center[0]), float(center[1]), float(center[2])) if center else None,
            phases=tuple(
                Phase(float(p["start_fraction"]), tuple(int(m) for m in p["request_millis"]))
                for p in d.get("phases", [])
            ),
            decompose_weights=tuple(float(w) for w in d.get("decompose_weights") or ()),
            qos=d.get("qos", QoS.REQUESTS.value),
            sizing="fixed" if sizing == "fixed" else "duty",
            workdir=d.get("workdir"),
            solver=d.get("solver"),
            wait=d.get("wait"),
            volume=d.get("volume"),
        )
