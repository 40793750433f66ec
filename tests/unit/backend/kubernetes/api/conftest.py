"""Fixtures of the API layer's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakeapiserver import FakeApiserver


@pytest.fixture
def server() -> Iterator[FakeApiserver]:
    """The HTTP apiserver fake, serving on 127.0.0.1 (its answers: a test's ``script`` or
    ``answer``)."""
    httpd = FakeApiserver().start()
    yield httpd
    httpd.stop()
