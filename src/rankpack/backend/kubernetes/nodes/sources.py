"""Which readings the backend uses: this node's files, or the node agents (`choose`).

Called once by `KubernetesBackend` when no source is given. Apart from `readings` (the
protocol and the node-local source) and `agents` (the agents' HTTP API) so that neither of
those imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import KubeApi
from rankpack.backend.kubernetes.nodes.agents import AgentReadings, cached_agents
from rankpack.backend.kubernetes.nodes.readings import Readings, local_readings

if TYPE_CHECKING:
    from rankpack.backend.kubernetes.api.informer import Cache


def choose(api: KubeApi, config: KubernetesConfig, *, cache: Cache | None = None) -> Readings:
    """The readings ``config.readings`` asks for (``auto``: this node's files when they are
    here, else the agents, found through ``cache`` when given: no List per lookup)."""
    local = local_readings(config)
    if config.readings == "node" or (config.readings == "auto" and local.available):
        return local
    namespace = config.agent_namespace or config.namespace
    return AgentReadings(api, agent_namespace=namespace, port=config.agent_port,
                         agents=cached_agents(cache, namespace) if cache else None)  # fmt: skip
