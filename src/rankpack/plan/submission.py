"""A submission: one simulation to run, and the one validation every way in uses.

`rankpack run` builds a `Submission` from its flags, `rankpack submit` queues one (stored as
JSON, `to_json` / `from_json`), and the operator turns a Simulation's spec into one
(`rankpack.operator.crd`). All three call `validate`, so a submission one of them accepts
the others accept too. The control loop stages and launches it; its plan (per-rank
requests) comes from the weights and budget, or from a phase schedule that starts at 0.

`validate` raises `InvalidSpec`, whose message names fields as ``{field}`` placeholders:
the CLI fills them in with its flags (``--iterations``), the operator with the spec's paths
(``spec.iterations``, `SPEC_FIELDS`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from rankpack.core.actions import WAIT_SETTINGS
from rankpack.core.failures import FailureCode
from rankpack.core.names import SOLVER_PATTERN
from rankpack.plan.allocation import Plan, QoS, make_plan
from rankpack.quantities import MAX_RANKS, InvalidQuantity, literal

DECOMPOSITIONS = ("equal", "weighted", "concentric")
SIZINGS = ("duty", "fixed")
MPIS = ("openmpi", "mpich")
"""The MPI libraries a solver may be built with (the shim's flavours,
`rankpack.profile.shim.FLAVOURS`; a unit test keeps both the same)."""
"""A command name (found on the rank image's PATH), never a path or a shell string."""

IMAGE_PATTERN = (
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]{1,5})?(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
"""A container image reference (``[registry[:port]/]path[:tag][@sha256:digest]``)."""
MAX_IMAGE = 512
SECRET_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Secret's name (a DNS subdomain)."""
MAX_PULL_SECRETS = 8

SPEC_FIELDS = {
    "case": "spec.case.path",
    "ranks": "spec.ranks",
    "weights": "spec.weights",
    "decompose_weights": "spec.weights",
    "budget": "spec.budgetMillis",
    "floor": "spec.floorMillis",
    "iterations": "spec.iterations",
    "decompose": "spec.decomposition",
    "phases": "spec.phases",
    "sizing": "spec.sizing",
    "solver": "spec.solver",
    "wait": "spec.wait",
    "mpi": "spec.mpi",
    "qos": "spec.qos",
    "image": "spec.image",
    "pull_secrets": "spec.imagePullSecrets",
}
"""How a Simulation's spec names the fields `validate` checks."""


class InvalidSpec(InvalidQuantity):
    """A submission that no backend should be asked to run (code ``InvalidSpec``)."""

    code = FailureCode.INVALID_SPEC


@dataclass(frozen=True)
class Phase:
    """From ``start_fraction`` of the run on, the ranks get these requests (seed 000 §3.2.3)."""

    start_fraction: float
    request_millis: tuple[int, ...]


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
    """How its ranks wait in MPI: a `rankpack.core.actions.WAIT_SETTINGS` name (default:
    the session's)."""
    volume: str | None = None
    """Kubernetes: where the run directory lives in the rank pods (default: the session's)."""
    mpi: str | None = None
    """The MPI library the solver was built with (`MPIS`; default: the session's)."""
    image: str | None = None
    """Kubernetes: the image its staging, launcher and ranks run (default: the session's,
    rankpack's rank image); admitted against the cluster admin's image prefixes."""
    pull_secrets: tuple[str, ...] = ()
    """Kubernetes: Secrets of its namespace that pull ``image`` (by name)."""

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
            "mpi": self.mpi,
            "image": self.image,
            "pull_secrets": list(self.pull_secrets),
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
            mpi=d.get("mpi"),
            image=d.get("image"),
            pull_secrets=tuple(str(s) for s in d.get("pull_secrets") or ()),
        )


def validate(sub: Submission) -> Submission:
    """``sub`` if it can be run; `InvalidSpec` naming the first bad field otherwise.

    Checks what the submission says by itself (not whether the case exists: staging
    checks that where the case is): ranks, weights, budget and floor, iterations,
    decomposition, phases, sizing, QoS, solver and wait mode.
    """
    if not sub.case:
        raise InvalidSpec("{case} is required (a case directory or tutorial name)")
    n = sub.n_ranks
    if n < 1 or n > MAX_RANKS:
        raise InvalidSpec(f"{{ranks}} must be 1..{MAX_RANKS}, got {n}")
    if not all(math.isfinite(w) and w >= 0 for w in sub.weights) or sum(sub.weights) <= 0:
        raise InvalidSpec("{weights} must be finite, >= 0 and not all 0")
    if sub.decompose_weights and len(sub.decompose_weights) != n:
        raise InvalidSpec(
            f"{{decompose_weights}} has {len(sub.decompose_weights)} values for {n} ranks"
        )
    if sub.qos not in {q.value for q in QoS}:
        raise InvalidSpec(f"{{qos}} must be one of {', '.join(q.value for q in QoS)}")
    plan = make_plan(
        list(sub.weights), sub.budget_millis, floor_millis=sub.floor_millis, qos=QoS(sub.qos)
    )  # InvalidQuantity: the floors do not fit the budget
    least = min(plan.ranks, key=lambda r: r.cpu_millis)
    if least.cpu_millis < 1:
        raise InvalidSpec(
            f"{{budget}} {sub.budget_millis}m gives rank {least.rank} {least.cpu_millis}m; "
            "every rank needs a request of at least 1m: raise {budget}, or set {floor}"
        )
    if sub.iterations is not None and sub.iterations < 1:
        raise InvalidSpec(f"{{iterations}} must be at least 1, got {sub.iterations}")
    if sub.decompose not in DECOMPOSITIONS:
        raise InvalidSpec(f"{{decompose}} must be one of {', '.join(DECOMPOSITIONS)}")
    _check_phases(sub.phases, n)
    if sub.sizing not in SIZINGS:
        raise InvalidSpec(f"{{sizing}} must be one of {', '.join(SIZINGS)}")
    check_solver(sub.solver)
    if sub.wait is not None and sub.wait not in WAIT_SETTINGS:
        raise InvalidSpec(f"{{wait}} must be one of {', '.join(WAIT_SETTINGS)}")
    if sub.mpi is not None and sub.mpi not in MPIS:
        raise InvalidSpec(f"{{mpi}} must be one of {', '.join(MPIS)}")
    _check_image(sub.image, sub.pull_secrets)
    return sub


def _check_image(image: str | None, secrets: tuple[str, ...]) -> None:
    if image is not None and (len(image) > MAX_IMAGE or not re.fullmatch(IMAGE_PATTERN, image)):
        raise InvalidSpec(
            "{image} must be an image reference such as registry.example.com/cfd/openfoam:12 "
            f"(lowercase path, optional :tag and @sha256:digest), got {literal(image, 120)}"
        )
    if len(secrets) > MAX_PULL_SECRETS:
        raise InvalidSpec(f"{{pull_secrets}} names at most {MAX_PULL_SECRETS} Secrets")
    for name in secrets:
        if len(name) > 253 or not re.fullmatch(SECRET_PATTERN, name):
            raise InvalidSpec(
                f"{{pull_secrets}}: {literal(name, 80)} is not a Secret's name (lowercase "
                "letters, digits, '-' and '.')"
            )


def _check_phases(phases: tuple[Phase, ...], n: int) -> None:
    for i, p in enumerate(phases):
        if len(p.request_millis) != n or min(p.request_millis, default=0) < 1:
            raise InvalidSpec(
                f"{{phases}}: each phase needs {n} values >= 1 (one request in millicores per rank)"
            )
        if not 0 <= p.start_fraction < 1:
            raise InvalidSpec(f"{{phases}}: start {p.start_fraction:g} must be in [0, 1)")
        if i and p.start_fraction <= phases[i - 1].start_fraction:
            raise InvalidSpec("{phases} must be given in increasing order of their start")


def check_solver(value: str | None) -> str | None:
    """A solver command name, or None (the case's own); `InvalidSpec` otherwise."""
    if value is None or value == "":
        return None
    if not re.fullmatch(SOLVER_PATTERN, value):
        raise InvalidSpec(
            "{solver} must be a command name such as simpleFoam (letters, digits, _.+-; "
            f"at most 64), got {literal(value, 80)}"
        )
    return value
