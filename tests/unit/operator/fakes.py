"""`FakeSims`, the stand-in for `SimulationApi` (the project's own boundary) in the operator's
unit tests: it keeps objects as the apiserver returns them and can be switched "down", when
every call raises like the official client does on a refused connection."""

from __future__ import annotations

import copy
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError, Conflict
from rankpack.operator import crd
from rankpack.plan.submission import Submission

Obj = dict[str, Any]


def Down(message: str) -> ApiError:
    return ApiError(0, "Unreachable", message)


class FakeSims:
    namespace = "ns"

    def __init__(self) -> None:
        self.objs: dict[str, Obj] = {}
        self.down = False
        self.patches: list[tuple[str, Obj]] = []
        self.version = 0

    def _check(self) -> None:
        if self.down:
            raise Down("connection refused")

    def add(self, name: str, status: Obj | None = None) -> None:
        sub = Submission(case="pitzDaily", weights=(1, 1), budget_millis=2000)
        obj = crd.simulation(name, sub)
        stamp = f"2026-01-01T00:00:0{len(self.objs)}Z"
        obj["metadata"].update(uid=f"uid-{name}", resourceVersion="1", creationTimestamp=stamp)
        if status is not None:
            obj["status"] = status
        self.objs[name] = obj

    def list(self) -> list[Obj]:
        self._check()
        return [copy.deepcopy(o) for o in self.objs.values()]

    def get(self, name: str) -> Obj:
        self._check()
        return copy.deepcopy(self.objs[name])

    def replace_status(self, obj: Obj) -> Obj:
        self._check()
        name = obj["metadata"]["name"]
        if obj["metadata"]["resourceVersion"] != self.objs[name]["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.objs[name]["status"] = copy.deepcopy(obj["status"])
        self._bump(name)
        return copy.deepcopy(self.objs[name])

    def patch_status(self, name: str, status: Obj) -> Obj:
        self._check()
        current = self.objs[name].setdefault("status", {})
        for k, v in status.items():  # a JSON merge patch, one level deep
            if v is None:
                current.pop(k, None)
            else:
                current[k] = copy.deepcopy(v)
        self.patches.append((name, status))
        self._bump(name)
        return copy.deepcopy(self.objs[name])

    def _bump(self, name: str) -> None:
        self.version += 1
        self.objs[name]["metadata"]["resourceVersion"] = str(self.version + 1)
