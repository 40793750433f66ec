"""Shared fixtures and the tiers. Every test gets its own database and run-directory root.

Each tier is a folder and a marker (docs/testing.md): a test under tests/integration,
tests/contract, tests/k8s or tests/peer carries its folder's marker whatever its module
declares, so ``-m integration`` and ``tests/integration`` select the same tests (plus,
for the marker, the contract suite's local param; ``-m k8s`` likewise adds its Kubernetes
param). tests/unit has no marker of its own: ``not integration and not k8s and not peer``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# A suite started in the background by a non-interactive shell (`nohup bash -c '...' &`)
# inherits SIGINT ignored, and so would every rankpack process the tests start: the tests
# that press Ctrl-C (SIGINT -> exit 130) would see nothing happen. Ctrl-C is what they
# test, so its default is restored here; exec'd children then start with it too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_TESTS = Path(__file__).parent
TIER_OF_FOLDER = {
    "integration": pytest.mark.integration,
    "contract": pytest.mark.contract,
    "k8s": pytest.mark.k8s,
    "peer": pytest.mark.peer,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if not path.is_relative_to(_TESTS):
            continue
        mark = TIER_OF_FOLDER.get(path.relative_to(_TESTS).parts[0])
        if mark is not None and item.get_closest_marker(mark.name) is None:
            item.add_marker(mark)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rankpack-home"
    monkeypatch.setenv("RANKPACK_HOME", str(home))
    monkeypatch.setenv("RANKPACK_DB", str(home / "rankpack.db"))
    return home


@pytest.fixture(scope="session")
def dev_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The k8s tier's dev cluster (`tests.k8s.conftest.DevCluster`), up once per session
    for every test that needs it (tests/k8s and the contract suite's Kubernetes param)
    and taken down, checked, after the last of them: see tests/k8s/conftest.py."""
    from tests.k8s.conftest import session_cluster

    yield from session_cluster(request)
