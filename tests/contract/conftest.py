"""The ``env`` fixture: one param per backend that must pass the contract suite.

Adding a backend: a `tests.contract.env.ContractEnv` implementation and a param here, e.g.
``pytest.param("local", marks=pytest.mark.integration)`` built in `_make_env`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.env import ContractEnv, KubernetesEnv, LocalEnv, SimulatedEnv

BACKENDS = [
    # in the unit tier: the same hang guard as tests/unit (tests/unit/conftest.py)
    pytest.param("simulated", id="simulated", marks=pytest.mark.timeout(10)),
    pytest.param("local", id="local", marks=pytest.mark.integration),
    pytest.param("kubernetes", id="kubernetes", marks=[pytest.mark.k8s, pytest.mark.timeout(900)]),
]


def _make_env(name: str, root: Path, request: pytest.FixtureRequest) -> ContractEnv:
    if name == "simulated":
        return SimulatedEnv(root)
    if name == "local":
        return LocalEnv(root)
    if name == "kubernetes":
        # the k8s tier's session cluster (tests/conftest.py), up once per session
        from tests.k8s.conftest import DevCluster

        cluster: DevCluster = request.getfixturevalue("dev_cluster")
        cluster.ensure_up()
        return KubernetesEnv(root, cluster)
    raise ValueError(f"no contract env for backend {name}")


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ContractEnv]:
    made = _make_env(request.param, tmp_path / "runs", request)
    yield made
    made.cleanup()
