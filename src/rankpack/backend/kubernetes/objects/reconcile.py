"""A simulation's Kubernetes objects: created idempotently, deleted through their owner.

Every simulation has an owner ConfigMap (its spec; the garbage collector's root), a headless
Service and one pod per rank group (`grouppods`; and in pod mode its launcher pod, `builders`).
`reconcile` creates them, or takes those that exist (at launch, adoption, and by the poller
after a transient error): one request per object when none exists. `delete` removes them
at release, reading what is left from the backend's cache (the poller retries orphans
without waiting); `undo` removes at once what a launch the apiserver refused halfway had
created (no partial gang is left), from a fresh List.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from rankpack.backend.kubernetes.api.config import KubernetesConfig, PodBounds, VolumeSource
from rankpack.backend.kubernetes.api.informer import newer, version_of
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import builders, grouppods, keyed, launcherpods
from rankpack.backend.kubernetes.objects.groups import RankGroup
from rankpack.backend.protocol import BackendError, LaunchFailed, SimSpec

PodsLeft = Callable[[float], list[Obj]]
"""A simulation's pods still there, as the backend's cache holds them, after waiting up to
the given seconds for the cache to change (0: now)."""


def reconcile(
    api: KubeApi,
    spec: SimSpec,
    groups: Sequence[RankGroup],
    image: str,
    volume: VolumeSource,
    *,
    launcher: launcherpods.LauncherOptions | None = None,
    create_first: bool = False,
    bounds: PodBounds | None = None,
) -> str:
    """Create the owner, the Service and the pod of every rank group, and with ``launcher``
    (pod mode) the launcher pod after them, taking those that exist (idempotent: objects that belong
    to this simulation are left alone; someone else's are an error). Returns the newest
    resourceVersion among them (`SimRecord.created_rv`).

    ``create_first`` (a launch: its objects are new) sends the create and reads an object
    only when it exists already (409): one request per object. Otherwise (an adoption, a
    retry after a transient error: some exist) each is read first, so that an existing pod
    is never created again against a full quota (the quota's admission answers before the
    conflict does)."""
    take = _create_or_take if create_first else _get_or_create
    made: list[Obj] = []
    key = keyed.new_key() if launcher is not None else None  # (an existing owner's stays)
    files = None if launcher is None else {keyed.LAUNCH_ITEM: launcher.instructions,
                                            keyed.HOSTFILE_ITEM: launcher.hostfile}  # fmt: skip
    owner = builders.owner_configmap(spec, image, key, files)
    owner_obj = take(api, "configmaps", owner, spec)
    made.append(owner_obj)
    ref = builders.OwnerRef(builders.owner_name(spec.sim_id), str(owner_obj["metadata"]["uid"]))
    made.append(take(api, "services", builders.headless_service(spec, ref), spec))
    account = launcher.rank_service_account if launcher is not None else None
    for group in groups:
        pod = grouppods.group_pod(spec, group, ref, volume, image, account, bounds,
                                  keyed=launcher is not None)  # fmt: skip
        made.append(take(api, "pods", pod, spec))
    if launcher is not None:
        made.append(take(api, "pods", launcherpods.launcher_pod(spec, ref, volume, image, launcher),
                         spec))  # fmt: skip
    newest = ""
    for obj in made:
        if newer(version_of(obj), newest):
            newest = version_of(obj)
    return newest


def _create_or_take(api: KubeApi, kind: str, body: Obj, spec: SimSpec) -> Obj:
    """Create; one that exists already (409) is read and taken if it is this
    simulation's, else an error."""
    name = str(body["metadata"]["name"])
    try:
        return api.create(kind, body)
    except ApiError as exc:
        if not exc.conflict:
            raise
    return _ours(api.get(kind, name), kind, spec)


def _get_or_create(api: KubeApi, kind: str, body: Obj, spec: SimSpec) -> Obj:
    name = str(body["metadata"]["name"])
    try:
        return _ours(api.get(kind, name), kind, spec)
    except ApiError as exc:
        if not exc.not_found:
            raise
    try:
        return api.create(kind, body)
    except ApiError as exc:
        if exc.conflict:  # created meanwhile (another controller): take it
            return _ours(api.get(kind, name), kind, spec)
        raise


def _ours(found: Obj, kind: str, spec: SimSpec) -> Obj:
    name = found.get("metadata", {}).get("name")
    if (found.get("metadata", {}).get("labels") or {}).get(builders.SIM_LABEL) != spec.sim_id:
        raise LaunchFailed(f"{kind} {name} exists and does not belong to {spec.sim_id}")
    return found


def undo(api: KubeApi, sim_id: str) -> int:
    """Remove what a refused launch created, at once: the owner (Foreground: the garbage
    collector deletes its dependents first), and every rank pod and the Service directly,
    so that none is left running whether or not a garbage collector is at work. Never
    waits; best effort against an apiserver that refuses (a `release` later retries).
    Returns how many rank pods were deleted (gone or going)."""
    deleted = 0
    with contextlib.suppress(ApiError):
        api.delete("configmaps", builders.owner_name(sim_id), "Foreground")
    with contextlib.suppress(ApiError):
        for pod in api.list_pods(builders.sim_selector(sim_id)):
            try:
                api.delete("pods", str(pod["metadata"]["name"]))
            except ApiError as exc:
                if not exc.not_found:
                    continue
            deleted += 1
    with contextlib.suppress(ApiError):
        api.delete("services", builders.service_name(sim_id))
    return deleted


def delete(
    api: KubeApi, config: KubernetesConfig, sim_id: str, pods_left: PodsLeft, *,
    wait: bool = True,
) -> bool:  # fmt: skip
    """Delete the owner (the garbage collector removes the Service and the pods) and
    wait, bounded, until the cache holds none of the simulation's pods; delete leftovers
    directly. Without ``wait``: one attempt, leftovers of a deleted owner deleted directly;
    True when no pod of it is left."""
    owner_gone = False
    try:
        api.delete("configmaps", builders.owner_name(sim_id), "Foreground")
    except ApiError as exc:
        if not exc.not_found:
            raise BackendError(f"cannot delete simulation {sim_id}: {exc}") from exc
        owner_gone = True
    deadline = time.monotonic() + config.release_timeout_s
    direct = False
    pause = 0.0
    while True:
        try:
            left = pods_left(pause)
        except ApiError as exc:
            raise BackendError(f"cannot read the pods of simulation {sim_id}: {exc}") from exc
        pause = 1.0
        if not left:
            return True
        if not wait:
            if owner_gone:
                for pod in left:
                    with contextlib.suppress(ApiError):
                        api.delete("pods", str(pod["metadata"]["name"]))
            return False
        if time.monotonic() > deadline:
            raise BackendError(
                f"rank pods of {sim_id} still exist after {config.release_timeout_s} s"
            )
        if not direct and time.monotonic() > deadline - config.release_timeout_s / 2:
            for pod in left:  # no garbage collector at work? delete them ourselves
                with contextlib.suppress(ApiError):
                    api.delete("pods", str(pod["metadata"]["name"]))
            with contextlib.suppress(ApiError):
                api.delete("services", builders.service_name(sim_id))
            direct = True
