"""Lost nodes from their Leases and Ready conditions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rankpack.backend.kubernetes.nodehealth import (
    NodeHealthRules,
    gone_nodes,
    lease_age_s,
    lost_nodes,
)

NOW = datetime(2026, 11, 26, 3, 0, 0, tzinfo=UTC).timestamp()


def node(name: str, ready: str = "True") -> dict[str, Any]:
    return {"metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}  # fmt: skip


def lease(age_s: float) -> dict[str, Any]:
    renewed = datetime.fromtimestamp(NOW - age_s, tz=UTC).isoformat().replace("+00:00", "Z")
    return {"spec": {"renewTime": renewed, "leaseDurationSeconds": 40}}


def test_a_lease_older_than_the_grace_makes_its_node_lost() -> None:
    nodes = [node("a"), node("b")]
    lost = lost_nodes(nodes, {"a": lease(9.5), "b": lease(61)}, NOW)
    assert list(lost) == ["b"]
    assert "61 s ago" in lost["b"]


def test_one_slow_renewal_is_not_a_lost_node() -> None:
    assert lost_nodes([node("a")], {"a": lease(25)}, NOW) == {}


def test_ready_unknown_is_lost_even_with_a_fresh_lease_or_without_leases() -> None:
    assert list(lost_nodes([node("a", "Unknown")], {"a": lease(1)}, NOW)) == ["a"]
    assert list(lost_nodes([node("a", "Unknown")], None, NOW)) == ["a"]
    # NotReady (a node that answers but is unwell: e.g. its network plugin) is not lost
    assert lost_nodes([node("a", "False")], {"a": lease(1)}, NOW) == {}


def test_without_a_lease_a_node_is_judged_by_its_ready_condition() -> None:
    assert lost_nodes([node("a")], {}, NOW) == {}
    assert lease_age_s(None, NOW) is None
    assert lease_age_s({"spec": {"renewTime": "not a time"}}, NOW) is None


def test_a_node_the_api_no_longer_lists_is_gone() -> None:
    assert gone_nodes(["a", "b", ""], [node("a")]) == {"b": "node b no longer exists"}


@given(age=st.floats(min_value=0, max_value=600), grace=st.floats(min_value=1, max_value=300))
def test_lost_exactly_when_older_than_the_grace(age: float, grace: float) -> None:
    lost = lost_nodes([node("a")], {"a": lease(age)}, NOW, NodeHealthRules(grace_s=grace))
    # the lease's time keeps microseconds: compare with the age it round-trips to
    real = lease_age_s(lease(age), NOW)
    assert real is not None
    assert ("a" in lost) == (real > grace)
