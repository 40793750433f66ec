"""A simulation's Kubernetes objects: created idempotently, deleted through their owner.

Every simulation has an owner ConfigMap (its spec; the garbage collector's root), a headless
Service and one pod per rank (and in pod mode its launcher pod), built by `builders`.
`reconcile` gets-or-creates them (at launch, adoption, and by the poller after a transient
error); `delete` removes them at release (and the poller retries orphans without waiting);
`undo` removes at once what a launch the apiserver refused halfway had created (no partial
gang is left).
"""

from __future__ import annotations

import contextlib
import time

from rankpack.backend.kubernetes import builders
from rankpack.backend.kubernetes.api import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.config import KubernetesConfig, VolumeSource
from rankpack.backend.protocol import BackendError, LaunchFailed, SimSpec


def reconcile(
    api: KubeApi,
    spec: SimSpec,
    image: str,
    volume: VolumeSource,
    *,
    launcher: builders.LauncherOptions | None = None,
) -> None:
    """Get-or-create the owner, the Service and every rank pod, and with ``launcher`` (pod
    mode) the launcher pod after them (idempotent: objects that exist and belong to this
    simulation are left alone; someone else's are an error)."""
    owner_obj = _get_or_create(api, "configmaps", builders.owner_configmap(spec, image), spec)
    owner = builders.OwnerRef(builders.owner_name(spec.sim_id), str(owner_obj["metadata"]["uid"]))
    _get_or_create(api, "services", builders.headless_service(spec, owner), spec)
    for rank in range(len(spec.ranks)):
        account = launcher.rank_service_account if launcher is not None else None
        pod = builders.rank_pod(spec, rank, owner, volume, image, account)
        _get_or_create(api, "pods", pod, spec)
    if launcher is not None:
        pod = builders.launcher_pod(spec, owner, volume, image, launcher)
        _get_or_create(api, "pods", pod, spec)


def _get_or_create(api: KubeApi, kind: str, body: Obj, spec: SimSpec) -> Obj:
    name = str(body["metadata"]["name"])
    try:
        found = api.get(kind, name)
    except ApiError as exc:
        if not exc.not_found:
            raise
    else:
        found_labels = found.get("metadata", {}).get("labels") or {}
        if found_labels.get(builders.SIM_LABEL) != spec.sim_id:
            raise LaunchFailed(f"{kind} {name} exists and does not belong to {spec.sim_id}")
        return found
    try:
        return api.create(kind, body)
    except ApiError as exc:
        if exc.conflict:  # created meanwhile (another controller): take it
            return api.get(kind, name)
        raise


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


def delete(api: KubeApi, config: KubernetesConfig, sim_id: str, *, wait: bool = True) -> bool:
    """Delete the owner (the garbage collector removes the Service and the pods) and
    wait, bounded, until the rank pods are gone; delete leftovers directly. Without
    ``wait``: one attempt, leftovers of a deleted owner deleted directly; True when no
    rank pod is left."""
    owner_gone = False
    try:
        api.delete("configmaps", builders.owner_name(sim_id), "Foreground")
    except ApiError as exc:
        if not exc.not_found:
            raise BackendError(f"cannot delete simulation {sim_id}: {exc}") from exc
        owner_gone = True
    deadline = time.monotonic() + config.release_timeout_s
    direct = False
    while True:
        left = api.list_pods(builders.sim_selector(sim_id))
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
        time.sleep(min(0.2, config.poll_s))
