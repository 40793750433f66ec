"""Rank groups: the ranks of one simulation on one node, held by one pod (decision 0012).

Pure, no I/O. `plan_groups` cuts a simulation's ranks into groups from the controller's
placement (`SimSpec.rank_nodes`); `group_resources` is what a group's container asks for,
`group_nices` each rank's nice value inside its group; `ranks_annotation` writes which ranks
a group pod holds and `parse_ranks_annotation` reads it back from the API (untrusted).
Called by the group pods' builder (`grouppods`) and by the backend's launch, observation
and resizes.

Groups are contiguous runs of ranks: Open MPI's ``--map-by slot`` and MPICH's hydra fill
the hostfile's entries in order, so the ranks an entry (a group pod) gets are consecutive.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from rankpack.backend.protocol import BackendError, RankResources
from rankpack.backend.ranknice import nices
from rankpack.quantities import MAX_RANKS


@dataclass(frozen=True)
class RankGroup:
    """The ranks of one simulation that share one pod, so one node and one cgroup."""

    index: int
    """Its place among the simulation's groups (0, 1, ...): its pod is ``...-g<index>``."""
    node: str | None
    """The node the controller placed its ranks on; None: the scheduler places the pod."""
    ranks: tuple[int, ...]
    """Its ranks, contiguous and ascending (at least one)."""

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"a rank group's index is at least 0, not {self.index}")
        if not _is_run(self.ranks):
            raise ValueError(f"a rank group's ranks are a contiguous ascending run: {self.ranks}")

    def pod_name(self, sim_id: str) -> str:
        """The group pod's name and hostname: ``rankpack-<sim>-g<index>``."""
        return f"rankpack-{sim_id}-g{self.index}"


def _is_run(ranks: Sequence[int]) -> bool:
    return bool(ranks) and ranks[0] >= 0 and list(ranks) == list(range(ranks[0], ranks[-1] + 1))


def plan_groups(n_ranks: int, rank_nodes: Sequence[str]) -> tuple[RankGroup, ...]:
    """A simulation's rank groups: each run of consecutive ranks placed on one node is a
    group (a node that comes back after another starts a new group: groups are contiguous);
    no placement (``rank_nodes`` empty) is one group of every rank, placed by the scheduler.
    BackendError for no ranks, or a placement that does not name one node per rank."""
    if n_ranks < 1:
        raise BackendError(f"a simulation has at least one rank, not {n_ranks}")
    if not rank_nodes:
        return (RankGroup(0, None, tuple(range(n_ranks))),)
    if len(rank_nodes) != n_ranks:
        raise BackendError(
            f"the placement names {len(rank_nodes)} nodes for {n_ranks} ranks (one per rank)"
        )
    if not all(rank_nodes):
        raise BackendError("the placement names a rank's node with an empty name")
    groups: list[RankGroup] = []
    start = 0
    for rank in range(1, n_ranks + 1):
        if rank == n_ranks or rank_nodes[rank] != rank_nodes[start]:
            groups.append(RankGroup(len(groups), rank_nodes[start], tuple(range(start, rank))))
            start = rank
    return tuple(groups)


def group_of(groups: Sequence[RankGroup], rank: int) -> RankGroup:
    """The group holding ``rank``; BackendError if none does."""
    for group in groups:
        if group.ranks[0] <= rank <= group.ranks[-1]:
            return group
    raise BackendError(f"rank {rank} is in none of the simulation's {len(groups)} rank groups")


def group_resources(ranks: Sequence[RankResources]) -> RankResources:
    """A group container's CPU from its ranks': the sum of their requests; a limit only if
    every rank has one (their sum). BackendError for no ranks, or for limits on some ranks
    only (a group's one cgroup cannot cap some of its ranks and not others)."""
    if not ranks:
        raise BackendError("a rank group has at least one rank")
    request = sum(r.request_millis for r in ranks)
    limits = [r.limit_millis for r in ranks if r.limit_millis is not None]
    if not limits:
        return RankResources(request)
    if len(limits) != len(ranks):
        raise BackendError(
            f"{len(limits)} of a rank group's {len(ranks)} ranks have a CPU limit: on "
            "Kubernetes a limit is the group's, so every rank of it needs one or none does"
        )
    return RankResources(request, sum(limits))


def group_nices(groups: Sequence[RankGroup], ranks: Sequence[RankResources]) -> dict[int, int]:
    """Every rank's nice value within its own group (each group's largest request at nice
    0, `ranknice.nices`), by rank; ``ranks`` is the simulation's resources by rank."""
    out: dict[int, int] = {}
    for group in groups:
        if group.ranks[-1] >= len(ranks):
            raise BackendError(f"rank group {group.index} holds ranks beyond the {len(ranks)}")
        requests = [ranks[r].request_millis for r in group.ranks]
        out.update(zip(group.ranks, nices(requests), strict=True))
    return out


def split_group(now: RankResources, ranks: Sequence[RankResources]) -> list[RankResources]:
    """The ranks' requests in a group pod whose container has (or asks for) ``now``: their
    own (``ranks``) when their sum is the pod's, else scaled to it in their ratio, at least
    1m each (a resize under way; or, at adoption, the resizes since the launch moved the
    sum and the pod does not record which rank's)."""
    total = sum(r.request_millis for r in ranks)
    if total == now.request_millis or total <= 0:
        return list(ranks)
    scale = now.request_millis / total
    return [replace(r, request_millis=max(1, round(r.request_millis * scale))) for r in ranks]


_DIGITS = f"(0|[1-9][0-9]{{0,{len(str(MAX_RANKS - 1)) - 1}}})"
_RUN = re.compile(f"{_DIGITS}(?:-{_DIGITS})?")
"""No more digits than the largest rank has, no leading zero: one text per run (parsing
then formatting gives the text back)."""


def ranks_annotation(group: RankGroup) -> str:
    """Which ranks a group pod holds, as its `RANKS_ANNOTATION` says: ``"0-3"``, or ``"5"``
    for a group of one rank."""
    first, last = group.ranks[0], group.ranks[-1]
    return str(first) if first == last else f"{first}-{last}"


def parse_ranks_annotation(text: str) -> tuple[int, ...]:
    """The ranks a `ranks_annotation` names. The text comes back from the API, so anyone
    who may edit the pod may have written it: ValueError unless it is exactly one run
    ``"a"`` or ``"a-b"`` with ``a <= b`` of ranks below ``quantities.MAX_RANKS``."""
    match = _RUN.fullmatch(text)
    if match is None:
        raise ValueError(f"not a run of ranks like '0-3': {text[:40]!r}")
    first = int(match.group(1))
    last = first if match.group(2) is None else int(match.group(2))
    if last >= MAX_RANKS or (match.group(2) is not None and last <= first):
        raise ValueError(
            f"not a run of ranks below {MAX_RANKS} with its first before its last: {text!r}"
        )
    return tuple(range(first, last + 1))


def plan_unplaced(requests_millis: Sequence[int], room: Mapping[str, int]) -> tuple[RankGroup, ...]:
    """The groups of a simulation the controller did not place (no ``rank_nodes``), from
    each node's free CPU (``room``, millicores): one group the scheduler places when every
    rank fits the roomiest node (or nothing is known of the nodes); else consecutive ranks
    fill the roomiest node first, then the next, the last taking what is left (a pod that
    does not fit waits for room like any pod)."""
    n = len(requests_millis)
    if n < 1:
        raise BackendError(f"a simulation has at least one rank, not {n}")
    if not room or sum(requests_millis) <= max(room.values()):
        return plan_groups(n, ())
    order = sorted(room, key=lambda node: (-room[node], node))
    nodes: list[str] = []
    at, left = 0, room[order[0]]
    for request in requests_millis:
        if request > left and nodes and nodes[-1] == order[at] and at + 1 < len(order):
            at += 1
            left = room[order[at]]
        nodes.append(order[at])
        left -= request
    return plan_groups(n, nodes)
