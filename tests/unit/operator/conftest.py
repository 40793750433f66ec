"""Fixtures of the operator's unit tests."""

from __future__ import annotations

import pytest

from tests.fakeapi import FakeSims


@pytest.fixture
def sims() -> FakeSims:
    """The real `SimulationApi` of namespace ``ns`` over a fresh fake apiserver."""
    return FakeSims()
