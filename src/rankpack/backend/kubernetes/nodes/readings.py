"""Where the Kubernetes backend gets its ranks' readings: this node's files, or the agents.

A reading (`nodereader.NodeRankReading`) is what a rank's node says of it: CPU counters
(its pod's cgroup; in a group pod, its process), its pod's CPU pressure and the shim's
latest record; the node also sets a group pod's ranks' nice values (decision 0012). Only
the node can say it (decision 0010), so the backend asks one of two `Readings`, chosen once
by `choose` from ``KubernetesConfig.readings``:

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

from collections.abc import Mapping, Sequence
from typing import Protocol

from rankpack.backend.kubernetes.api.config import KubernetesConfig, NodeFiles
from rankpack.backend.kubernetes.api.kubeapi import Obj
from rankpack.backend.kubernetes.nodes.nodereader import NodeRankReading, NodeReader, NotPublished
from rankpack.backend.protocol import BackendError
from rankpack.errors import UserError


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

    def read(self, pod: Obj, rank: int | None = None) -> NodeRankReading | None:
        """Rank ``rank`` of the pod (None: a one-rank pod's own rank); None when the node
        has no reading of it (not a rank or group pod holding ``rank``, or its node does not
        list it yet). Raises `ReadingsMissing` when its node cannot be asked now."""
        ...

    def set_wait_mode(self, sim_id: str, pods: Sequence[Obj], mode: str) -> None:
        """Ask every rank of ``pods`` (all of one simulation's; a group pod's: all its
        ranks) to wait in ``mode``. BackendError when a rank's record is not published yet
        or its node cannot be reached (the controller asks again)."""
        ...

    def set_nices(self, sim_id: str, pod: Obj, nices: Mapping[int, int]) -> None:
        """Give ranks of the pod these nice values (rank -> 0..19). BackendError when it
        cannot be done now: a rank's process not known yet (nothing is changed then), its
        node unreachable, or refused (the controller asks again)."""
        ...


class LocalReadings:
    """The node's files, read in this process (it runs on the rank pods' node, or on the
    machine of every node of the dev cluster: one reader per node)."""

    name = "node-local"

    def __init__(self, reader: NodeReader, by_node: dict[str, NodeReader] | None = None) -> None:
        self.reader = reader
        self.by_node = dict(by_node or {})

    @property
    def available(self) -> bool:
        return any(r.available for r in [self.reader, *self.by_node.values()])

    def _reader(self, pod: Obj) -> NodeReader:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        return self.by_node.get(node, self.reader)

    def prefetch(self, pods: Sequence[Obj]) -> None:
        return None

    def read(self, pod: Obj, rank: int | None = None) -> NodeRankReading | None:
        try:
            return self._reader(pod).read(pod, rank)
        except ValueError:  # not a rank or group pod holding that rank: nothing to read
            return None

    def set_wait_mode(self, sim_id: str, pods: Sequence[Obj], mode: str) -> None:
        groups: dict[int, tuple[NodeReader, list[Obj]]] = {}
        for pod in pods:
            reader = self._reader(pod)
            groups.setdefault(id(reader), (reader, []))[1].append(pod)
        try:
            for reader, group in groups.values():
                reader.set_wait_modes(group, mode)
        except NotPublished as exc:
            raise BackendError(f"{sim_id}: {exc}; try again") from exc
        except (UserError, ValueError, OSError) as exc:
            raise BackendError(f"{sim_id}: cannot set wait mode {mode}: {exc}") from exc

    def set_nices(self, sim_id: str, pod: Obj, nices: Mapping[int, int]) -> None:
        try:
            self._reader(pod).set_nices(pod, nices)
        except NotPublished as exc:
            raise BackendError(f"{sim_id}: {exc}; try again") from exc
        except (UserError, ValueError, OSError) as exc:
            raise BackendError(f"{sim_id}: cannot set nice values: {exc}") from exc


def node_reader(files: NodeFiles) -> NodeReader:
    return NodeReader(files.kubelet_root, files.cgroup_root, files.pods_cgroup)


def local_readings(config: KubernetesConfig) -> LocalReadings:
    return LocalReadings(
        node_reader(config.node_files),
        {node: node_reader(files) for node, files in config.node_files_by_node},
    )
