"""Staging a case of a user with fewer rights in a staging pod (`objects.stagepods`).

The Kubernetes backend's `worker.Stager` runs `PodStaging.run` for a confined `StageSpec`
(the operator's Simulations): this process reserves the run directory (an empty directory
it makes: nothing of the case is read), creates the staging pod in the Simulation's
namespace (staging's Python in this backend's image, ``config.image``; the case's OpenFOAM
in a sidecar of the Simulation's: `objects.stagepods`) and waits for it through the shared
cache (`informer`; no request is sent to look). The pod's termination message is its
answer (`rankpack.case.stagewire`, parsed strictly, at most 4096 bytes): the staged case,
or what is wrong with it and its code.
The pod is deleted once read, also when the stage is cancelled or its time is up; a
failed stage's run directory is emptied and removed (by file descriptor: no link in it is
followed). Nothing of the case is opened here, ever.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rankpack import untrusted
from rankpack.backend.kubernetes.api.config import StagingBounds, parse_volume
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.backend.kubernetes.objects import stagepods
from rankpack.backend.kubernetes.objects.rbac import RANK_SERVICE_ACCOUNT
from rankpack.backend.kubernetes.objects.status import CANNOT_START_REASONS, container_status
from rankpack.backend.kubernetes.record import rank_dir
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.protocol import BackendError
from rankpack.case import stagewire, staging
from rankpack.case.staging import StagedCase, StageRefused, StageSpec
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError

POD_UID = 1000
"""The uid the rank image runs as (its user ``rankpack``): a run directory this process
makes as root is handed to it."""
START_GRACE_S = 180.0
"""Beyond the pod's own deadline, how long it may take to be scheduled (a pod that cannot
start on its node, or is deleted, fails at once: `outcome`)."""


MOVES = 3
"""How many times a staging pod bound to a node that was lost before it started is made
again (the scheduler no longer places on that node)."""


@dataclass(frozen=True)
class PodStaging:
    """Stages in pods of ``state``'s namespace (`run`), checks without reading (`check`)."""

    state: BackendState
    lost: Callable[[], Mapping[str, str]] = dict
    """The lost nodes (`lostnodes.NodeWatch.lost`): a staging pod stranded on one is made
    again elsewhere (`stranded`)."""

    @property
    def bounds(self) -> StagingBounds:
        return self.state.config.staging

    def check(self, spec: StageSpec) -> None:
        staging.check_values(spec)
        if spec.n_ranks > stagewire.MAX_RANKS:
            raise UserError(f"a staging pod reports at most {stagewire.MAX_RANKS} ranks, "
                            f"not {spec.n_ranks}; use fewer ranks")  # fmt: skip
        parse_volume(spec.volume, spec.runs_root / "run")  # (a volume out of shape: said now)

    def run(self, spec: StageSpec, stop: threading.Event) -> StagedCase:
        made = spec.resume is None and spec.workdir is None
        run_dir = self._run_dir(spec)
        try:
            return self._stage(spec, run_dir, stop)
        except BaseException:
            if spec.resume is None:
                staging.empty(run_dir)
                if made:
                    with contextlib.suppress(OSError):
                        run_dir.rmdir()
            raise

    def _run_dir(self, spec: StageSpec) -> Path:
        try:
            return self._make_run_dir(spec)
        except PermissionError as exc:  # the volume's, not the case's: say whose to fix
            raise UserError(
                f"the run directory cannot be made in {spec.runs_root}: {exc.strerror}; "
                f"the volume's directory must be writable by uid {os.geteuid()} (the operator)"
            ) from None

    def _make_run_dir(self, spec: StageSpec) -> Path:
        if spec.resume is not None:
            return spec.resume.run_dir
        if spec.workdir is not None:
            run_dir = spec.workdir
            staging.check_workdir(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
        else:  # named after the case as given (its text, not its files)
            name = Path(spec.case).name[:60] or "case"
            run_dir = staging.new_run_dir(spec.runs_root, name, spec.n_ranks)
        if os.geteuid() == 0:  # (the pod runs as the image's user)
            os.chown(run_dir, POD_UID, POD_UID)
        return run_dir

    def _stage(self, spec: StageSpec, run_dir: Path, stop: threading.Event) -> StagedCase:
        b = self.state
        volume = parse_volume(spec.volume, run_dir)
        pod = stagepods.staging_pod(
            spec.sim_id, stagewire.request_text(spec, run_dir),
            image=spec.image or b.config.image, tools_image=b.config.image,
            pull_secrets=spec.pull_secrets,
            volume=volume, run_dir=run_dir,
            case_root=Path(spec.case_root) if spec.case_root else None,  # (None: a tutorial)
            bounds=self.bounds,
            service_account=RANK_SERVICE_ACCOUNT if b.config.launcher == "pod" else None,
        )  # fmt: skip
        name = pod["metadata"]["name"]
        self._create(pod)
        try:
            staged = self._answer(spec, run_dir, pod, stop)
        finally:
            with contextlib.suppress(ApiError, BackendError):
                b.api.delete("pods", name, grace_s=0)
        own = rank_dir(run_dir)
        if spec.resume is None and (own.exists() or own.is_symlink()):
            # rankpack writes its launch files there next: what the case put in its place
            # (a link above all) would be followed
            raise StageRefused(f"the case made {own.name} in its run directory, which is "
                               "rankpack's own; rename it", FailureCode.STAGE_FAILED)  # fmt: skip
        return staged

    def _create(self, pod: Obj, attempts: int = 10) -> None:
        name = pod["metadata"]["name"]
        for attempt in range(attempts):
            try:
                self.state.api.create("pods", pod)
                return
            except ApiError as exc:
                # (a pod force-deleted a moment ago may still hold its name)
                if exc.status != 409 or attempt == attempts - 1:
                    raise UserError(f"cannot create the staging pod {name}: {exc}") from None
                time.sleep(1.0)

    def _answer(
        self, spec: StageSpec, run_dir: Path, body: Obj, stop: threading.Event
    ) -> StagedCase:
        b = self.state
        name = body["metadata"]["name"]
        informer = b.cache.informer(b.pods_collection)
        give_up = time.monotonic() + self.bounds.deadline_s + START_GRACE_S
        existed, moves = False, 0
        while True:
            seen = informer.version
            pod = informer.get(name, b.api.namespace)
            if pod is not None:
                existed = True
                text = outcome(pod, self.bounds)
                if text is not None:
                    return _read(text, spec, run_dir)
                why = stranded(pod, self.lost())
                if why is not None and moves < MOVES:  # its node went before it started
                    moves, existed = moves + 1, False
                    with contextlib.suppress(ApiError):
                        b.api.delete("pods", name, grace_s=0)
                    self._create(body)
                    give_up = time.monotonic() + self.bounds.deadline_s + START_GRACE_S
                    continue
            elif existed:
                raise StageRefused(f"the staging pod {name} was deleted before it answered",
                                   FailureCode.STAGE_FAILED)  # fmt: skip
            if stop.is_set():
                raise UserError("staging was cancelled")
            if time.monotonic() > give_up:
                raise StageRefused(
                    f"the staging pod {name} did not end within "
                    f"{self.bounds.deadline_s + START_GRACE_S:.0f} s", FailureCode.STAGE_FAILED,
                )  # fmt: skip
            informer.wait(seen, 1.0)


def stranded(pod: Obj, lost: Mapping[str, str]) -> str | None:
    """Why a staging pod that has not started will not (its node is lost: no kubelet there
    will start it, or end it at its deadline), None otherwise."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or node not in lost or (pod.get("status") or {}).get("phase") != "Pending":
        return None
    return f"its node {node} was lost ({lost[node]}) before it started"


def outcome(pod: Obj, bounds: StagingBounds) -> str | StageRefused | None:
    """A staging pod's answer: its termination message once its container ended, or why it
    ended without one; None while it runs."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if status.get("reason") == "DeadlineExceeded":
        why = f"staging did not end within its deadline of {bounds.deadline_s} s"
        return StageRefused(f"{why} (the admin's --staging-deadline)", FailureCode.STAGE_FAILED)
    cs = container_status(pod, stagepods.STAGE_CONTAINER)
    ended = ((cs or {}).get("state") or {}).get("terminated")
    if ended:
        if ended.get("reason") == "OOMKilled":
            return StageRefused(f"staging ran out of its memory limit ({bounds.memory})",
                                FailureCode.STAGE_FAILED)  # fmt: skip
        message = ended.get("message")
        if isinstance(message, str) and message.strip():
            return message
        return StageRefused(
            f"the staging pod ended (exit {ended.get('exitCode')}, "
            f"{str(ended.get('reason') or '')[:40]}) without an answer", FailureCode.STAGE_FAILED,
        )  # fmt: skip
    if phase in ("Failed", "Succeeded"):
        why = str(status.get("message") or status.get("reason") or phase)[:200]
        return StageRefused(f"the staging pod ended without an answer: {why}",
                            FailureCode.STAGE_FAILED)  # fmt: skip
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return StageRefused("the staging pod was deleted before it answered",
                            FailureCode.STAGE_FAILED)  # fmt: skip
    return _cannot_start(pod)


def _cannot_start(pod: Obj) -> StageRefused | None:
    """Why a container of the staging pod will not start, or its init container failed
    (then the others never start); None if they may yet."""
    for name, init in ((stagepods.TOOLS_CONTAINER, True), (stagepods.OPENFOAM_CONTAINER, True),
                       (stagepods.STAGE_CONTAINER, False)):  # fmt: skip
        state = (container_status(pod, name, init=init) or {}).get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        if reason in CANNOT_START_REASONS or (reason == "CrashLoopBackOff" and init):
            # the image, or its config: for good (a sidecar that keeps failing, too)
            why = f"{reason}: {str(waiting.get('message') or '')[:200]}".rstrip(": ")
            return StageRefused(f"the staging pod cannot start its {name} container ({why})",
                                FailureCode.STAGE_FAILED)  # fmt: skip
        ended = state.get("terminated") or {}
        if name == stagepods.TOOLS_CONTAINER and ended.get("exitCode", 0) != 0:
            why = str(ended.get("message") or ended.get("reason") or "")[:200]
            code = ended.get("exitCode")
            said = f"the staging pod's tools could not be put in place (exit {code}: {why})"
            return StageRefused(said, FailureCode.STAGE_FAILED)
    return None


def _read_cells(path: Path) -> str:
    """The cells file a staging pod named (the user's: a regular file, no link, bounded)."""
    try:
        return untrusted.read_text(path, stagewire.CELLS_FILE_MAX)
    except OSError as exc:
        raise ValueError(f"its cells file cannot be read: {exc}") from None


def _read(found: str | StageRefused, spec: StageSpec, run_dir: Path) -> StagedCase:
    if isinstance(found, StageRefused):
        raise found
    try:
        answer = stagewire.parse_answer(
            found, run_dir, spec.case, spec.n_ranks, read_cells=lambda n: _read_cells(run_dir / n)
        )
    except stagewire.BadAnswer as exc:
        raise StageRefused(f"the staging pod's answer is not one: {exc}",
                           FailureCode.STAGE_FAILED) from None  # fmt: skip
    if isinstance(answer, stagewire.SandboxFailure):
        raise StageRefused(answer.error, answer.code)
    return answer
