"""Lost nodes from their Leases and Ready conditions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rankpack.backend.kubernetes.nodes.nodehealth import (
    NodeHealthRules,
    gone_nodes,
    lease_age_s,
    lost_nodes,
)
from tests.unit.backend.kubernetes._helpers import node_object

NOW = datetime(2026, 11, 26, 3, 0, 0, tzinfo=UTC).timestamp()


def aged_lease(age_s: float) -> dict[str, Any]:
    renewed = datetime.fromtimestamp(NOW - age_s, tz=UTC).isoformat().replace("+00:00", "Z")
    return {"spec": {"renewTime": renewed, "leaseDurationSeconds": 40}}


OK = node_object("ok")
"""A node that answers: beside it, a silent node is lost (alone, see the full disruption)."""


def fine(**leases: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"ok": aged_lease(0), **leases}


def test_a_lease_older_than_the_grace_makes_its_node_lost() -> None:
    nodes = [node_object("a"), node_object("b"), OK]
    lost = lost_nodes(nodes, fine(a=aged_lease(9.5), b=aged_lease(61)), NOW)
    assert list(lost) == ["b"]
    assert "61 s ago" in lost["b"]


def test_one_slow_renewal_is_not_a_lost_node() -> None:
    assert lost_nodes([node_object("a"), OK], fine(a=aged_lease(25)), NOW) == {}


def test_ready_unknown_is_lost_once_its_lease_missed_two_renewals() -> None:
    assert list(lost_nodes([node_object("a", "Unknown"), OK], fine(a=aged_lease(26)), NOW)) == ["a"]
    assert list(lost_nodes([node_object("a", "Unknown"), OK], None, NOW)) == ["a"]
    # its kubelet is getting through again (after an apiserver restart the node lifecycle
    # controller may mark every node Unknown before their kubelets renew): not lost
    assert lost_nodes([node_object("a", "Unknown"), OK], fine(a=aged_lease(1)), NOW) == {}
    # NotReady (a node that answers but is unwell: e.g. its network plugin) is not lost
    assert lost_nodes([node_object("a", "False"), OK], fine(a=aged_lease(1)), NOW) == {}


def test_silence_counts_from_when_the_view_came_back_after_a_break() -> None:
    # the apiserver was away until 10 s ago: no kubelet could renew while it was; a Lease
    # 100 s old has been silent for 10 s of a view that could see a renewal
    nodes, leases = [node_object("a", "Unknown"), OK], fine(a=aged_lease(100))
    assert lost_nodes(nodes, leases, NOW, fresh_since_s=NOW - 10) == {}
    assert list(lost_nodes(nodes, leases, NOW, fresh_since_s=NOW - 30)) == ["a"]
    ready = [node_object("a"), OK]
    assert lost_nodes(ready, leases, NOW, fresh_since_s=NOW - 59) == {}
    assert list(lost_nodes(ready, leases, NOW, fresh_since_s=NOW - 61)) == ["a"]
    # without Leases the Ready condition counts once the view has been fresh that long
    assert lost_nodes(nodes, None, NOW, fresh_since_s=NOW - 10) == {}


def test_every_node_silent_at_once_is_the_control_plane_not_the_nodes() -> None:
    # the node lifecycle controller's "full disruption": nothing is judged lost
    both = [node_object("a", "Unknown"), node_object("b", "Unknown")]
    assert lost_nodes(both, {"a": aged_lease(70), "b": aged_lease(65)}, NOW) == {}
    assert lost_nodes([node_object("a", "Unknown")], None, NOW) == {}  # a one-node cluster
    assert list(lost_nodes([*both, OK], fine(a=aged_lease(70), b=aged_lease(65)), NOW)) == [
        "a",
        "b",
    ]


def test_without_a_lease_a_node_is_judged_by_its_ready_condition() -> None:
    assert lost_nodes([node_object("a"), OK], fine(), NOW) == {}
    assert lease_age_s(None, NOW) is None
    assert lease_age_s({"spec": {"renewTime": "not a time"}}, NOW) is None


def test_a_node_the_api_no_longer_lists_is_gone() -> None:
    assert gone_nodes(["a", "b", ""], [node_object("a")]) == {"b": "node b no longer exists"}


@given(
    age=st.floats(min_value=0, max_value=600),
    grace=st.floats(min_value=1, max_value=300),
    back=st.one_of(st.none(), st.floats(min_value=0, max_value=600)),
)
def test_lost_exactly_when_silent_longer_than_the_grace(
    age: float, grace: float, back: float | None
) -> None:
    fresh = None if back is None else NOW - back
    rules = NodeHealthRules(grace_s=grace)
    lost = lost_nodes([node_object("a"), OK], fine(a=aged_lease(age)), NOW, rules, fresh)
    # the lease's time keeps microseconds: compare with the age it round-trips to
    real = lease_age_s(aged_lease(age), NOW)
    assert real is not None
    silent = real if back is None else min(real, NOW - (NOW - back))  # (as it rounds)
    assert ("a" in lost) == (silent > grace)
