"""What the real backends share: their news flag and their staging worker.

`News` is a backend's event source for `Backend.wait`: any thread (a staging worker, a
process waiter, a poller) calls `notify`; the control loop's `wait` returns at the first
news since its last call, or at its timeout.

`Stager` stages cases in worker threads, one per simulation (`rankpack.case.staging` on this
machine, or a staging pod of the Kubernetes backend: its ``run`` and ``check``), as
protocol v2 asks: `stage` returns at once; the outcome is read by `observe` (STAGING, then
STAGED with the staged case, or FAILED with the stage error); a stage cancelled by `stop`
or `release` before its launch has its copy removed, since it holds no results yet (but a
case staged again to resume after a lost node, `StageSpec.resume`: that one holds them). The local
and the Kubernetes backend stage the same way (on this machine, or on the volume the rank pods
share), so they share this.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rankpack.backend.protocol import BackendError, SimObservation, SimPhase
from rankpack.case import staging
from rankpack.case.staging import StagedCase, StageSpec, failure_code
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError


class News:
    """A flag set by any thread and consumed by the one waiting control loop."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = False

    def notify(self) -> None:
        with self._cond:
            self._pending = True
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self._cond:
            if not self._pending:
                self._cond.wait(max(0.0, timeout_s))
            self._pending = False


@dataclass
class _Stage:
    spec: StageSpec
    thread: threading.Thread
    result: StagedCase | None = None
    error: str | None = None
    failure: FailureCode = FailureCode.STAGE_FAILED
    """The code of ``error`` (`NotACase` when the case is none)."""
    done: bool = False
    cancelled: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    """Set by `cancel` and `release`: a ``run`` that waits may end early (its pod deleted)."""


def stage_here(spec: StageSpec, stop: threading.Event) -> StagedCase:
    """Stage in this process (`staging.stage`), which runs to its end: ``stop`` unused."""
    del stop
    return staging.stage(spec)


class Stager:
    """The staging half of a backend: simulations staged but not launched yet.

    ``run`` stages one spec in the worker thread (raising UserError with what is wrong);
    ``check`` validates it before a thread or a directory exists (raising UserError)."""

    def __init__(
        self,
        notify: Callable[[], None],
        run: Callable[[StageSpec, threading.Event], StagedCase] = stage_here,
        check: Callable[[StageSpec], object] = staging.check,
    ) -> None:
        self._notify = notify
        self._run_stage = run
        self._check = check
        self._stages: dict[str, _Stage] = {}

    def __contains__(self, sim_id: str) -> bool:
        return sim_id in self._stages

    def stage(self, spec: StageSpec) -> None:
        """Start staging ``spec`` (the caller has checked that the id is new to it too)."""
        if spec.sim_id in self._stages:
            raise BackendError(f"simulation {spec.sim_id} exists already")
        entry = _Stage(spec, threading.Thread(target=self._run, args=(spec,), daemon=True))
        self._stages[spec.sim_id] = entry
        try:
            if spec.resume is None:  # (a case to resume was checked when it was staged)
                self._check(spec)  # bad input fails here, before a thread or a directory exists
        except UserError as exc:
            entry.error, entry.done = str(exc), True
            entry.failure = failure_code(exc)
            self._notify()
            return
        entry.thread.start()

    def _run(self, spec: StageSpec) -> None:
        entry = self._stages[spec.sim_id]
        try:
            entry.result = self._run_stage(spec, entry.stop)
        except UserError as exc:
            entry.error, entry.failure = str(exc), failure_code(exc)
        except Exception as exc:  # a staging bug must not kill the loop: report it
            entry.error = f"staging failed: {exc!r}"
        entry.done = True
        if entry.cancelled and entry.result is not None and spec.resume is None:
            shutil.rmtree(entry.result.run_dir, ignore_errors=True)
        self._notify()

    def observe(self, sim_id: str, now: float) -> SimObservation | None:
        """The observation of a simulation still in staging; None if it is not."""
        entry = self._stages.get(sim_id)
        if entry is None:
            return None
        if not entry.done:
            return SimObservation(sim_id, now, SimPhase.STAGING, ())
        if entry.error is not None:
            return SimObservation(
                sim_id, now, SimPhase.FAILED, (), reason=entry.error, stage_error=entry.error,
                failure=entry.failure,
            )  # fmt: skip
        return SimObservation(sim_id, now, SimPhase.STAGED, (), staged=entry.result)

    def launched(self, sim_id: str) -> _Stage | None:
        """``sim_id`` is launched: its staging is over (its copy is the run directory).
        Returns its stage, for `restore` if the launch is refused after all."""
        return self._stages.pop(sim_id, None)

    def restore(self, stage: _Stage | None) -> None:
        """A launch was refused and nothing of it is left: ``stage`` (from `launched`) is
        staged again, so that it can be launched later or released (its copy removed)."""
        if stage is not None:
            self._stages[stage.spec.sim_id] = stage

    def cancel(self, sim_id: str) -> bool:
        """`stop` of a simulation in staging: its copy is removed when the worker ends.
        False if it is not in staging."""
        entry = self._stages.get(sim_id)
        if entry is None:
            return False
        entry.cancelled = True
        entry.stop.set()
        return True

    def release(self, sim_id: str) -> bool:
        """`release` of a simulation in staging: the worker is waited for and the copy,
        staged but never launched, removed. False if it is not in staging."""
        entry = self._stages.pop(sim_id, None)
        if entry is None:
            return False
        entry.cancelled = True
        entry.stop.set()
        if entry.thread.is_alive():
            entry.thread.join(timeout=60)
        if entry.result is not None and entry.spec.resume is None:  # (a resumed case holds
            shutil.rmtree(entry.result.run_dir, ignore_errors=True)  # results: never removed)
        return True

    def forget_all(self) -> None:
        """Drop every stage from memory (their workers finish on their own)."""
        self._stages.clear()
