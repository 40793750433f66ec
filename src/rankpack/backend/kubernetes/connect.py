"""Connecting the Kubernetes backend: `connect`, `connect_api`, `connect_namespaces`.

Called by the CLI (`rankpack.cli.backends`) for a run on a cluster and by the operator
(`rankpack.operator.service`) for each namespace it serves: each makes the backend (or the
REST client) on the official client and checks at once, in one line, that the apiserver
answers and the identity may use the namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.kubernetes.tenants import NamespacedBackends
from rankpack.backend.protocol import BackendError
from rankpack.backend.worker import News


def connect(config: KubernetesConfig) -> KubernetesBackend:
    """A backend on the official client; fails at once, in one line, if the apiserver does
    not answer or the identity may not use the namespace (checked by the first List of its
    cache: the namespace's pods, watched from then on)."""
    api = connect_api(config, check=False)
    backend = KubernetesBackend(api, config)
    try:
        _check(api, config, lambda: backend.cache.informer(backend.pods_collection))
    except BackendError:
        backend.close()
        raise
    return backend


def connect_api(config: KubernetesConfig, *, check: bool = True) -> ClientKubeApi:
    """The REST client `connect` gives its backend (the operator shares it for Simulations
    and its Lease), checked the same way (a List of rankpack's pods) unless ``check`` is
    false."""
    api = ClientKubeApi(config)
    if check:
        _check(api, config, lambda: api.list_pods("app.kubernetes.io/managed-by=rankpack"))
    return api


def _check(api: ClientKubeApi, config: KubernetesConfig, read: Callable[[], object]) -> None:
    try:
        found = read()
    except ApiError as exc:
        if exc.status == 0:
            raise BackendError(
                f"the Kubernetes API at {api.host} is unreachable ({exc.message}); "
                "is the cluster up (rankpack dev-cluster status)?"
            ) from exc
        raise BackendError(
            f"cannot list pods in namespace {config.namespace} at {api.host}: {exc}"
        ) from exc
    if getattr(found, "forbidden", False):
        raise BackendError(
            f"cannot list pods in namespace {config.namespace} at {api.host}: 403 Forbidden"
        )


def connect_namespaces(config: KubernetesConfig, namespaces: tuple[str, ...]) -> NamespacedBackends:
    """A backend per namespace (``config`` with that namespace), each checked as `connect`
    checks one (the error names the namespace the identity may not use), all waking one
    `News`; each counts the others' pods in its inventory, and those of ``config``'s own
    namespace (where the operator itself runs) when it is not one of them."""
    news = News()
    backends: dict[str, KubernetesBackend] = {}
    counted = (*namespaces, *((config.namespace,) if config.namespace not in namespaces else ()))
    try:
        for ns in namespaces:
            others = tuple(n for n in counted if n != ns)
            cfg = replace(config, namespace=ns, counted_namespaces=others)
            api = connect_api(cfg, check=False)
            backend = backends[ns] = KubernetesBackend(api, cfg, news=news)
            cache, pods = backend.cache, backend.pods_collection
            _check(api, cfg, partial(cache.informer, pods))
    except BackendError:
        for backend in backends.values():
            backend.close()
        raise
    return NamespacedBackends(backends, news)
