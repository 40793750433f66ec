"""The `Simulation` custom resource: its definition, and its spec as a `Submission`.

`crd_manifest()` is the single source of the CustomResourceDefinition; ``deploy/base/crd.yaml``
holds the same object and a unit test keeps the two identical. A spec is validated by the
same `rankpack.plan.submission.validate` as `rankpack run` and `submit`; a bad spec fails its
Simulation with the reason (``InvalidSpec``), it never stops the operator.
"""

from __future__ import annotations

from typing import Any

from rankpack.case import stagewire
from rankpack.core.actions import WAIT_SETTINGS
from rankpack.core.names import SOLVER_PATTERN
from rankpack.errors import UserError
from rankpack.plan import submission
from rankpack.plan.submission import (
    DECOMPOSITIONS,
    SPEC_FIELDS,
    Phase,
    Submission,
    validate,
)
from rankpack.quantities import MAX_RANKS, InvalidQuantity

GROUP = "rankpack.dev"
VERSION = "v1alpha1"
KIND = "Simulation"
PLURAL = "simulations"
API_VERSION = f"{GROUP}/{VERSION}"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rankpack", "app.kubernetes.io/name": "rankpack"}
EVENT_SEQUENCE = f"{GROUP}/sequence"
"""Annotation on the operator's Events: the store event's id, which orders Events posted in
the same second (their timestamps have whole seconds)."""

PHASES = ("Queued", "Starting", "Running", "Succeeded", "Failed")
"""A Simulation's life: ``Starting`` from its claim (staging, its pods created and started)
until every rank runs, ``Running`` only then (issue 40)."""
CLAIMED = ("Starting", "Running")
"""The phases of a Simulation an operator has claimed and not ended."""

Obj = dict[str, Any]


MAX_MILLIS = 1_000_000
"""The most CPU one rank may ask for (1000 cores), millicores."""
MAX_ITERATIONS = stagewire.MAX_ITERATIONS
"""The most iterations a Simulation may ask for (a staging sandbox's answer holds no more)."""
MAX_WEIGHT = 1e9


def _int(minimum: int, maximum: int | None = None) -> Obj:
    out: Obj = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        out["maximum"] = maximum
    return out


def _spec_schema() -> Obj:
    millis_list = {"type": "array", "items": _int(1, MAX_MILLIS), "maxItems": MAX_RANKS}
    return {
        "type": "object",
        "required": ["case"],
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.budgetMillis) || !has(self.ranks)"
                " || self.budgetMillis >= self.ranks",
                "message": "budgetMillis must give every rank at least 1m (>= ranks)",
            }
        ],
        "properties": {
            "case": {
                "type": "object",
                "required": ["path"],
                "properties": {
                    "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                             "description": "case directory or installed tutorial name"},
                    "volume": {"type": "string", "maxLength": 4096,
                               "description": "pvc:CLAIM[:MOUNT] or host:DIR"},
                },
            },
            "ranks": _int(1, MAX_RANKS),
            "weights": {"type": "array", "maxItems": MAX_RANKS,
                        "items": {"type": "number", "minimum": 0, "maximum": MAX_WEIGHT}},
            "budgetMillis": _int(1, MAX_RANKS * MAX_MILLIS),
            "floorMillis": _int(0, MAX_MILLIS),
            "iterations": _int(1, MAX_ITERATIONS),
            "decomposition": {"type": "string", "enum": list(DECOMPOSITIONS)},
            "sizing": {"type": "string", "enum": ["duty", "fixed"]},
            "solver": {"type": "string", "pattern": SOLVER_PATTERN,
                       "description": "solver command (default: the case's application)"},
            "wait": {"type": "string", "enum": list(WAIT_SETTINGS),
                     "description": "how ranks wait in MPI (default: the operator's --wait)"},
            "mpi": {"type": "string", "enum": list(submission.MPIS),
                    "description": "the MPI library the solver was built with: openmpi "
                    "(mpirun) or mpich (hydra) (default: what the case's solver links, "
                    "else the operator's); the other family than it links is refused"},
            "image": {"type": "string", "maxLength": submission.MAX_IMAGE,
                      "pattern": submission.IMAGE_PATTERN,
                      "description": "the image staging, the launcher and the ranks run "
                      "(default: the operator's rank image); one the cluster admin allows"},
            "imagePullSecrets": {"type": "array", "maxItems": submission.MAX_PULL_SECRETS,
                                 "items": {"type": "string", "maxLength": 253,
                                           "pattern": submission.SECRET_PATTERN},
                                 "description": "Secrets of the namespace that pull the "
                                 "image, by name"},
            "phases": {
                "type": "array",
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "required": ["startFraction", "requestMillis"],
                    "properties": {
                        "startFraction": {"type": "number", "minimum": 0, "maximum": 1},
                        "requestMillis": millis_list,
                    },
                },
            },
        },
    }  # fmt: skip


def _rank_schema() -> Obj:
    """One rank in a Simulation's status (``status.ranks[]``)."""
    return {
        "type": "object",
        "properties": {
            "rank": _int(0),
            "requestMillis": _int(0),
            "allocatedMillis": _int(0),
            "cpuCores": {"type": "number"},
            "duty": {"type": "number"},
            "node": {"type": "string", "description": "the node the rank runs on"},
            "resize": {
                "type": "object",
                "description": "a resize in flight (pending, in-progress, deferred)",
                "properties": {
                    "state": {"type": "string"},
                    "toMillis": _int(0),
                    "reason": {"type": "string"},
                },
            },
            "wait": {
                "type": "object",
                "description": "how the rank waits in MPI, on which node, and why",
                "properties": {
                    "mode": {"type": "string"},
                    "node": {"type": "string", "nullable": True},
                    "why": {"type": "string"},
                },
            },
        },
    }


def _condition_schema() -> Obj:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            k: {"type": "string"}
            for k in ("type", "status", "reason", "message", "lastTransitionTime")
        },
    }


def _status_schema() -> Obj:
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "phase": {
                "type": "string",
                "enum": list(PHASES),
                "description": "Queued; Starting (claimed: staged, its pods started) until "
                "every rank runs; Running; Succeeded or Failed",
            },
            "reason": {
                "type": "string",
                "description": "why it failed, or why it waits while Queued, as a code "
                "(rankpack.core.failures.FailureCode: PodDeleted, OOMKilled, InvalidSpec, ...; "
                "QuotaExceeded, NoRoom, MaxRunningPerNamespace, ... while Queued)",
            },
            "message": {
                "type": "string",
                "description": "why it failed or waits, in words (names the pod, the exit code, "
                "the error, the quota)",
            },
            "operator": {"type": "string"},
            "usage": {
                "type": "string",
                "description": "where its ranks' CPU usage and duty cycles are read: node-agent "
                "(each node's rankpack node agent) or node-local (the controller is on the node)",
            },
            "launcher": {
                "type": "string",
                "description": "how its ranks are started: launcher-pod (mpirun in a pod of the "
                "Simulation's namespace) or mpirun+pods/exec (mpirun beside the controller)",
            },
            "simId": {"type": "string"},
            "runId": _int(0),
            "runDir": {"type": "string"},
            "startedAt": {"type": "string"},
            "iterations": _int(0),
            "expectedIterations": _int(0),
            "progress": {"type": "string"},
            "resizes": _int(0),
            "restarts": _int(0),
            "ranks": {"type": "array", "items": _rank_schema()},
            "eta": {
                "type": "string",
                "description": "when it should reach its expected iterations, at its rate "
                "over the last minute (UTC)",
            },
            "duty": {
                "type": "object",
                "description": "mean and lowest share of wall time its ranks spend computing "
                "(outside MPI), from the PMPI shim",
                "properties": {"mean": {"type": "number"}, "min": {"type": "number"}},
            },
            "efficiency": {
                "type": "number",
                "description": "CPU doing solver work (the ranks' duty, a core each) "
                "over the CPU its ranks request",
            },
            "nodes": {"type": "string", "description": "the nodes its ranks run on"},
            "residuals": {
                "type": "object",
                "maxProperties": 16,
                "additionalProperties": {"type": "number"},
                "description": "the latest initial residual of each solved field",
            },
            "waitMode": {
                "type": "object",
                "description": "the wait mode of the simulation's ranks (spin|polite|adaptive)"
                " and the rule's reason: polite where ranks outnumber a node's cores",
                "properties": {"mode": {"type": "string"}, "reason": {"type": "string"}},
            },
            "conditions": {"type": "array", "items": _condition_schema()},
            "result": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "staged": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }


def crd_manifest() -> Obj:
    columns = [
        ("Phase", "string", ".status.phase"),
        ("Reason", "string", ".status.reason"),
        ("Case", "string", ".spec.case.path"),
        ("Ranks", "integer", ".spec.ranks"),
        ("Iter", "integer", ".status.iterations"),
        ("ETA", "string", ".status.eta"),
        ("Duty", "number", ".status.duty.mean"),
        ("Eff", "number", ".status.efficiency"),
        ("Nodes", "string", ".status.nodes"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    wide = [  # kubectl get -o wide
        ("Progress", "string", ".status.progress"),
        ("MinDuty", "number", ".status.duty.min"),
        ("Resizes", "integer", ".status.resizes"),
        ("Restarts", "integer", ".status.restarts"),
        ("Wait", "string", ".status.waitMode.mode"),
        ("Run", "integer", ".status.runId"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": dict(MANAGED_BY)},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "simulation",
                "kind": KIND,
                "listKind": f"{KIND}List",
                "shortNames": ["sim", "sims"],
                "categories": ["rankpack"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p} for n, t, p in columns
                    ]
                    + [{"name": n, "type": t, "jsonPath": p, "priority": 1} for n, t, p in wide],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": _spec_schema(),
                                "status": _status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


# -- spec <-> Submission -------------------------------------------------------------------


def spec_of(sub: Submission, volume: str | None = None) -> Obj:
    """The Simulation spec that `submission_of` turns back into ``sub`` (with ``volume``,
    if given, as its volume)."""
    volume = volume or sub.volume
    spec: Obj = {
        "case": {"path": sub.case},
        "ranks": sub.n_ranks,
        "weights": list(sub.weights),
        "budgetMillis": sub.budget_millis,
        "decomposition": sub.decompose,
        "sizing": sub.sizing,
    }
    if volume:
        spec["case"]["volume"] = volume
    if sub.floor_millis:
        spec["floorMillis"] = sub.floor_millis
    if sub.iterations is not None:
        spec["iterations"] = sub.iterations
    if sub.phases:
        spec["phases"] = [
            {"startFraction": p.start_fraction, "requestMillis": list(p.request_millis)}
            for p in sub.phases
        ]
    if sub.solver:
        spec["solver"] = sub.solver
    if sub.wait:
        spec["wait"] = sub.wait
    if sub.mpi:
        spec["mpi"] = sub.mpi
    if sub.image:
        spec["image"] = sub.image
    if sub.pull_secrets:
        spec["imagePullSecrets"] = list(sub.pull_secrets)
    return spec


def simulation(name: str, sub: Submission, volume: str | None = None) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": spec_of(sub, volume),
    }


def submission_of(obj: Obj) -> Submission:
    """The Submission a Simulation asks for; UserError naming the bad field otherwise."""
    name = obj.get("metadata", {}).get("name", "?")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise UserError(f"simulation {name}: no spec.case (give spec.case.path)")
    try:
        return _submission(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"simulation {name}: bad spec ({type(exc).__name__}: {exc})") from exc


def _submission(spec: Obj) -> Submission:
    case = spec.get("case")
    path = str(case["path"]) if isinstance(case, dict) else ""
    if not path:
        raise UserError("spec.case.path is required (a case directory or tutorial name)")
    weights = [float(w) for w in spec.get("weights") or ()]
    ranks = int(spec.get("ranks") or len(weights) or 0)
    if not weights:
        weights = [1.0] * ranks
    if len(weights) != ranks:
        raise UserError(f"spec.weights has {len(weights)} entries for {ranks} ranks")
    iterations = spec.get("iterations")
    if iterations is not None and not 1 <= int(iterations) <= MAX_ITERATIONS:
        raise UserError(f"spec.iterations must be at least 1 and at most {MAX_ITERATIONS}, "
                        f"got {iterations}")  # fmt: skip
    phases = [
        Phase(float(p["startFraction"]), tuple(int(m) for m in p["requestMillis"]))
        for p in spec.get("phases") or ()
    ]
    sizing = str(spec.get("sizing") or "duty")
    solver, wait = spec.get("solver"), spec.get("wait")
    sub = Submission(
        case=path,
        weights=tuple(weights),
        budget_millis=int(spec.get("budgetMillis") or 1000 * ranks),
        floor_millis=int(spec.get("floorMillis") or 0),
        iterations=int(iterations) if iterations is not None else None,
        decompose=str(spec.get("decomposition") or "equal"),
        phases=tuple(phases),
        sizing="fixed" if sizing == "fixed" or phases else "duty",
        solver=str(solver) if solver not in (None, "") else None,
        wait=str(wait) if wait is not None else None,
        volume=volume_of({"spec": spec}),
        mpi=str(spec["mpi"]) if spec.get("mpi") is not None else None,
        image=str(spec["image"]) if spec.get("image") else None,
        pull_secrets=tuple(str(s) for s in spec.get("imagePullSecrets") or ()),
    )
    if sizing not in submission.SIZINGS:
        raise UserError(f"spec.sizing must be one of {', '.join(submission.SIZINGS)}")
    try:
        return validate(sub)
    except InvalidQuantity as exc:  # the one validation, its fields named as in the spec
        raise UserError(exc.render(lambda name: SPEC_FIELDS.get(name, name))) from None


def check_solver(value: object, what: str) -> str | None:
    """A solver command name, or None; UserError naming ``what`` otherwise."""
    try:
        return submission.check_solver(None if value is None else str(value))
    except InvalidQuantity as exc:
        raise UserError(exc.render(lambda _: what)) from None


def volume_of(obj: Obj) -> str | None:
    case = (obj.get("spec") or {}).get("case") or {}
    volume = case.get("volume") if isinstance(case, dict) else None
    return str(volume) if volume else None
