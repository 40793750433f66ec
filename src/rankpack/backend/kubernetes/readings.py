"""Where the Kubernetes backend gets its ranks' readings: this node's files, or the agents.

A reading (`nodereader.RankReading`) is what a rank pod's node says of it: cgroup counters,
CPU pressure and the shim's latest record. Only the node can say it (decision 0010), so the
backend asks one of two `Readings`, chosen once by `choose` from
``KubernetesConfig.readings``:

- `LocalReadings` (``node-local``): this process runs on the rank pods' node (the
  single-node dev cluster, ``rankpack run --backend kubernetes`` on the host) and reads the
  node's files in-process with the same `nodereader.NodeReader` the agent uses;
- `agents.AgentReadings` (``node-agent``): the node agent of each rank pod's node, over
  the pod network (the in-cluster operator, which has no host mounts).

``auto`` picks ``node`` when the kubelet's pods directory and the pods cgroup are here.
The name is what ``placement()["usage"]`` reports (and a run's JSON, and the Simulation's
status). A source that cannot answer for a node raises `ReadingsMissing`: the backend then
flags that node's ranks (``RankObservation.readings_ok``) instead of reporting their last
counters as fresh, and the controller decides nothing for their simulation meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from rankpack.backend.kubernetes.api import KubeApi, Obj
from rankpack.backend.kubernetes.config import KubernetesConfig
from rankpack.backend.kubernetes.nodereader import NodeReader, NotPublished, RankReading
from rankpack.backend.protocol import BackendError
from rankpack.errors import UserError

if TYPE_CHECKING:
    from rankpack.backend.kubernetes.informer import Cache


class ReadingsMissing(BackendError):
    """A node's readings cannot be had now (its agent is unreachable or answered an error)."""

    def __init__(self, node: str, why: str) -> None:
        super().__init__(f"node agent on {node} unreachable: {why}")
        self.node = node
        self.why = why


class Readings(Protocol):
    name: str
    """``node-local`` or ``node-agent`` (``placement()["usage"]``)."""

    def prefetch(self, pods: Sequence[Obj]) -> None:
        """Fetch what `read` will need for these pods (outside the backend's lock: a
        network source may take its timeout). Never raises."""
        ...

    def read(self, pod: Obj) -> RankReading | None:
        """The rank pod's reading; None when the node has none for it (its cgroup is not
        there yet). Raises `ReadingsMissing` when its node cannot be asked now."""
        ...

    def set_wait_mode(self, sim_id: str, pods: Sequence[Obj], mode: str) -> None:
        """Ask every rank of ``pods`` (all of one simulation's) to wait in ``mode``.
        BackendError when a rank's record is not published yet or its node cannot be
        reached (the controller asks again)."""
        ...


class LocalReadings:
    """The node's files, read in this process (it runs on the rank pods' node)."""

    name = "node-local"

    def __init__(self, reader: NodeReader) -> None:
        self.reader = reader

    def prefetch(self, pods: Sequence[Obj]) -> None:
        return None

    def read(self, pod: Obj) -> RankReading | None:
        try:
            return self.reader.read(pod)
        except ValueError:  # not a rank pod's uid or rank label: nothing to read
            return None

    def set_wait_mode(self, sim_id: str, pods: Sequence[Obj], mode: str) -> None:
        try:
            self.reader.set_wait_modes(pods, mode)
        except NotPublished as exc:
            raise BackendError(f"{sim_id}: {exc}; try again") from exc
        except (UserError, ValueError, OSError) as exc:
            raise BackendError(f"{sim_id}: cannot set wait mode {mode}: {exc}") from exc


def node_reader(config: KubernetesConfig) -> NodeReader:
    files = config.node_files
    return NodeReader(files.kubelet_root, files.cgroup_root, files.pods_cgroup)


def choose(api: KubeApi, config: KubernetesConfig, *, cache: Cache | None = None) -> Readings:
    """The readings ``config.readings`` asks for (``auto``: this node's files when they are
    here, else the agents, found through ``cache`` when given: no List per lookup)."""
    from rankpack.backend.kubernetes.agents import AgentReadings, cached_agents

    reader = node_reader(config)
    if config.readings == "node" or (config.readings == "auto" and reader.available):
        return LocalReadings(reader)
    namespace = config.agent_namespace or config.namespace
    return AgentReadings(api, agent_namespace=namespace, port=config.agent_port,
                         agents=cached_agents(cache, namespace) if cache else None)  # fmt: skip
