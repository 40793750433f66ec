"""Admission of a Simulation's spec: what a user may ask the operator for, checked as data
before anything runs (issue 26).

The operator is a deputy: it holds rights (host paths on the dev cluster, the case volume,
every namespace's rank pods) that the people who create Simulations do not. So every
field of a Simulation is untrusted, and what the operator will do with it is bounded by
what the cluster admin configured, never by the Simulation itself:

* ``spec.case.volume: host:DIR`` mounts a node's directory into the rank pods: refused
  (``HostVolumeNotAllowed``) unless DIR lies under a host prefix the admin allowed
  (``rankpack operator --allow-host-path``); none is allowed by default. ``pvc:`` volumes
  are the namespace's own claims and pass.
* ``spec.case.path`` is a tutorial name (no ``/``: resolved among the installed tutorials)
  or an absolute path under a case root the admin configured (``--case-root``): no ``..``
  component, and once its symlinks are resolved still under the (resolved) root
  (``CasePathNotAllowed``). Nothing outside the roots is read: the path is checked as text
  first, and only a path already under a root is resolved on disk.
* ``spec.solver`` must be one of the applications the admin allows (default: the OpenFOAM
  applications the image ships, `openfoam_applications`; for an image under a prefix the
  admin named solvers for, those: `rankpack.plan.images`), ``SolverNotAllowed`` otherwise.
  The same list bounds the case's own ``application`` at launch (`LoopSettings.solvers`).
* ``spec.image`` (what its staging, launcher and ranks run) must be the operator's own rank
  image or lie under an image prefix the admin allowed (``--allow-image``): a prefix
  matches itself, or an image that continues it after ``/``, ``:`` or ``@`` (so
  ``registry.example.com/cfd`` allows ``registry.example.com/cfd/foam:12`` but not
  ``registry.example.com/cfd-other``), ``ImageNotAllowed`` otherwise.
* A Simulation whose ranks cannot fit the cluster even at the minimum request of 1m each
  is refused (``DoesNotFit``) instead of heading the queue forever.

`admit` raises `Refused` (a `UserError` with a reason code); the Simulation's arrival
(`rankpack.operator.arrivals`, the first listing that shows it) ends it ``Failed`` with that
code and message in its status, and nothing is staged or created.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rankpack.core.failures import Failure, FailureCode
from rankpack.errors import UserError
from rankpack.plan.images import ImageSolvers, image_allowed, solvers_for
from rankpack.plan.submission import Submission

TUTORIAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")
OPENFOAM_BIN = Path("/usr/bin")
"""Where Debian's OpenFOAM installs its applications (the dev image mounts the host's)."""
MIN_REQUEST_MILLIS = 1
"""The smallest CPU request a rank pod can have (Kubernetes' resolution)."""


class Refused(UserError):
    """A spec the admin's policy does not allow; ``code`` is the Simulation's status and
    condition reason."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.failure = Failure(code, message)


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the cluster admin allows Simulations to ask for (the operator's flags)."""

    host_prefixes: tuple[str, ...] = ()
    """Absolute host directories under which ``host:`` volumes may lie (default: none)."""
    case_roots: tuple[str, ...] = ()
    """Absolute directories under which ``case.path`` may lie (default: none, tutorial
    names only)."""
    solvers: frozenset[str] = frozenset()
    """Applications a Simulation may run (empty: none may be named in ``spec.solver``)."""
    cluster_millis: int | None = None
    """What all schedulable nodes, Ready or not, can allocate together (None: not known, no
    fit check)."""
    images: tuple[str, ...] = ()
    """Image prefixes a Simulation's ``spec.image`` may lie under (the operator adds its
    own rank image; empty: only that one)."""
    image_solvers: ImageSolvers = ()
    """Image prefixes whose images run only the solvers named (`rankpack.plan.images`)."""
    resolve_links: bool = True
    """Resolve a case path's symbolic links on this process's disk: only where this process
    stages cases itself. False where each case is staged in a pod of its own namespace,
    which resolves the path in its own view (the operator looks at no file of a case; a
    link swapped in after admission reaches nothing outside the namespace's part)."""


def openfoam_applications(bin_dir: Path = OPENFOAM_BIN) -> frozenset[str]:
    """The OpenFOAM applications installed in ``bin_dir`` (``*Foam`` executables), the
    default solver allowlist: the image's own solvers, never a shell or a utility."""
    try:
        names = [p.name for p in bin_dir.iterdir() if p.name.endswith("Foam")]
    except OSError:
        return frozenset()
    return frozenset(n for n in names if os.access(bin_dir / n, os.X_OK))


def _lexical(path: str) -> str | None:
    """``path`` normalized as text, or None if it is relative or climbs (``..``)."""
    if not path.startswith("/") or "\0" in path:
        return None
    if any(part == ".." for part in path.split("/")):
        return None
    return posixpath.normpath(path)


def _under(path: str, roots: Iterable[str]) -> str | None:
    """The root ``path`` lies under (or is), if any."""
    for root in roots:
        r = posixpath.normpath(root)
        if path == r or path.startswith(r.rstrip("/") + "/"):
            return r
    return None


def case_root_of(path: str, policy: AdmissionPolicy) -> str | None:
    """The admin's case root an admitted case path lies under (None: a tutorial name)."""
    text = _lexical(path) if "/" in path else None
    return _under(text, policy.case_roots) if text is not None else None


def check_host_volume(volume: str | None, policy: AdmissionPolicy) -> None:
    if not volume or not volume.startswith("host:"):
        return
    text = volume[len("host:") :]
    path = _lexical(text)
    allowed = ", ".join(policy.host_prefixes) or "none"
    if path is None or _under(path, policy.host_prefixes) is None:
        raise Refused(
            FailureCode.HOST_VOLUME_NOT_ALLOWED,
            f"spec.case.volume {volume[:200]!r} mounts a host directory the cluster admin did "
            f"not allow (allowed host prefixes: {allowed}); use a pvc: volume of your "
            "namespace, or ask the admin to allow the prefix (rankpack operator "
            "--allow-host-path)",
        )


def check_case_path(
    path: str, policy: AdmissionPolicy, resolve: Callable[[str], str] = os.path.realpath
) -> None:
    if "/" not in path:
        if not TUTORIAL_NAME.match(path) or path in (".", ".."):
            raise Refused(
                FailureCode.CASE_PATH_NOT_ALLOWED,
                f"spec.case.path {path[:80]!r} is neither a tutorial name (letters, digits, "
                "_.+-) nor an absolute path; give e.g. pitzDaily",
            )
        return
    roots = ", ".join(policy.case_roots) or "none: tutorial names only"
    fix = (
        f"give a tutorial name such as pitzDaily or a case under an allowed root ({roots}); "
        "the admin sets the roots with rankpack operator --case-root"
    )
    text = _lexical(path)
    if text is None:
        raise Refused(
            FailureCode.CASE_PATH_NOT_ALLOWED,
            f"spec.case.path {path[:200]!r} must be absolute and may not contain '..'; {fix}",
        )
    root = _under(text, policy.case_roots)
    if root is None:
        raise Refused(
            FailureCode.CASE_PATH_NOT_ALLOWED,
            f"spec.case.path {text[:200]!r} is not allowed; {fix}",
        )
    real, real_root = resolve(text), resolve(root)
    if _under(real, (real_root,)) is None:
        raise Refused(
            FailureCode.CASE_PATH_NOT_ALLOWED,
            f"spec.case.path {text[:200]!r} leads out of the allowed root {root} through a "
            f"symbolic link (to {real[:200]}); {fix}",
        )


def check_solver_allowed(
    solver: str | None, policy: AdmissionPolicy, image: str | None = None
) -> None:
    allowed = solvers_for(image, policy.solvers, policy.image_solvers)
    if solver is not None and solver not in allowed:
        raise Refused(FailureCode.SOLVER_NOT_ALLOWED, solver_refusal(solver, allowed))


def solver_refusal(solver: str, allowed: frozenset[str]) -> str:
    shown = ", ".join(sorted(allowed)[:8]) + (", ..." if len(allowed) > 8 else "")
    return (
        f"{solver[:80]!r} is not an allowed solver (allowed: {shown or 'none'}); name one of "
        "the image's OpenFOAM solvers, or ask the admin to allow it (rankpack operator --solver)"
    )


def check_image(image: str | None, policy: AdmissionPolicy) -> None:
    if image is None or image_allowed(image, policy.images):
        return
    allowed = ", ".join(policy.images) or "none"
    raise Refused(
        FailureCode.IMAGE_NOT_ALLOWED,
        f"spec.image {image[:200]!r} is not an image the cluster admin allows (allowed "
        f"prefixes: {allowed}); leave spec.image out for rankpack's own image, or ask the "
        "admin to allow its registry or repository (rankpack operator --allow-image)",
    )


def check_fit(sub: Submission, policy: AdmissionPolicy) -> None:
    if policy.cluster_millis is None:
        return
    least = sub.n_ranks * max(MIN_REQUEST_MILLIS, sub.floor_millis)
    if least > policy.cluster_millis:
        raise Refused(
            FailureCode.DOES_NOT_FIT,
            f"{sub.n_ranks} ranks need at least {least}m even at their minimum request, and "
            f"all nodes together (Ready or not) can allocate {policy.cluster_millis}m; ask for "
            "fewer ranks (or a lower floorMillis)",
        )


def admit(
    sub: Submission, policy: AdmissionPolicy, resolve: Callable[[str], str] = os.path.realpath
) -> None:
    """Raise `Refused` if the admin's policy does not allow ``sub``; cheap checks first, and
    the case path (the only one that may look at the disk, inside a root, and only with
    ``policy.resolve_links``) last."""
    check_host_volume(sub.volume, policy)
    check_image(sub.image, policy)
    check_solver_allowed(sub.solver, policy, sub.image)
    check_fit(sub, policy)
    check_case_path(sub.case, policy, resolve if policy.resolve_links else str)


MAX_RUNNING_REASON = "MaxRunningPerNamespace"
"""The reason of a Simulation held because its namespace runs as many as allowed."""


@dataclass(frozen=True)
class NamespaceLimits:
    """How many Simulations one namespace may have queued and running (the admin's
    ``--max-queued-per-namespace`` and ``--max-running-per-namespace``), so that no
    namespace fills the queue or the cluster for the others. Counted per namespace, so
    that they hold when several namespaces are served."""

    max_queued: int | None = 100
    """Queued Simulations per namespace; one more is refused ``TooManyQueued``. None: any."""
    max_running: int | None = None
    """Running (claimed) Simulations per namespace; the next waits ``Queued``. None: only
    the operator's ``--max-concurrent`` bounds them."""

    def queued_refusal(self, namespace: str, queued: int) -> str:
        """Why a new Simulation of ``namespace``, which has ``queued`` queued already, is
        refused ('' if it is not)."""
        if self.max_queued is None or queued < self.max_queued:
            return ""
        return (
            f"namespace {namespace} already has {queued} Simulations queued, the most the "
            f"operator accepts (--max-queued-per-namespace {self.max_queued}); create it again "
            "once some of them have started, or delete queued ones you no longer need"
        )

    def running_hold(self, namespace: str, running: int) -> str:
        """Why a queued Simulation of ``namespace``, which runs ``running``, waits ('' if it
        does not)."""
        if self.max_running is None or running < self.max_running:
            return ""
        return (
            f"namespace {namespace} runs {running} Simulations, the most the operator runs at "
            f"once for one namespace (--max-running-per-namespace {self.max_running}); it "
            "starts when one of them ends"
        )
