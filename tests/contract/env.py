"""What the backend contract suite needs from a backend: a `ContractEnv`.

Every backend runs the same tests (``tests/contract/test_backend_contract.py``). To add a
backend, write a class that satisfies `ContractEnv` (a backend, a way to make a small
stageable case, time bounds on the backend's clock) and add a param to the ``env`` fixture
in ``tests/contract/conftest.py`` (with ``marks=pytest.mark.integration`` if it needs
OpenFOAM, MPI or a cluster).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rankpack.backend.protocol import (
    Backend,
    RankPhase,
    RankResources,
    SimObservation,
    SimPhase,
    SimSpec,
    StagedCase,
    StageSpec,
)
from rankpack.case.foamlog import LogParser
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

Length = Literal["short", "long"]


class ContractEnv(Protocol):
    @property
    def backend(self) -> Backend:
        """The backend under test (the tests' "first controller process")."""
        ...

    n_ranks: int
    request_millis: int
    """Each rank's request at launch; a resize to 1.5x this must fit on a node."""
    tick_s: float
    """How long a test waits between two observations (backend clock)."""
    stage_timeout_s: float
    """Bound on staging a case (backend clock)."""
    run_timeout_s: float
    """Bound on a short run from launch to its end, and on a resize to settle."""
    wait_slack_s: float
    """How late `wait(timeout)` may return after its timeout."""

    def stage_spec(self, sim_id: str, length: Length = "short") -> StageSpec:
        """A small case with ``n_ranks`` ranks: a short one ends well within
        ``run_timeout_s``; a long one runs for longer than any test lasts."""
        ...

    def bad_stage_spec(self, sim_id: str) -> StageSpec:
        """A case that cannot be staged (it does not exist)."""
        ...

    def sim_spec(self, sim_id: str, staged: StagedCase) -> SimSpec:
        """The launch spec of a staged case: ``n_ranks`` ranks of ``request_millis``."""
        ...

    def new_backend(self) -> Backend:
        """A second backend instance that sees the same simulations (a restarted controller)."""
        ...

    def cleanup(self) -> None:
        """Stop and release whatever the tests left behind."""
        ...


@dataclass
class SimulatedEnv:
    """The simulated backend: one 4-core node, 1-s staging, start and resize latency."""

    root: Path
    n_ranks: int = 2
    request_millis: int = 1000
    tick_s: float = 1.0
    stage_timeout_s: float = 30.0
    run_timeout_s: float = 120.0
    wait_slack_s: float = 0.0
    real_time_limit_s: float = 0.5
    """Every test against this env must take less real time than this."""
    cluster: SimulatedCluster = field(init=False)
    backend: SimulatedBackend = field(init=False)
    created: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.cluster = SimulatedCluster(
            cases=(
                SimulatedCase("short", cells=2000, iterations=40, cell_work_s=5e-4),
                SimulatedCase("long", cells=2000, iterations=100_000, cell_work_s=5e-4),
            ),
            timing=SimTiming(stage_s=1.0, start_s=1.0, resize_latency_s=1.0),
        )
        self.backend = SimulatedBackend(self.cluster)

    def stage_spec(self, sim_id: str, length: Length = "short") -> StageSpec:
        self.created.append(sim_id)
        return StageSpec(sim_id=sim_id, case=length, n_ranks=self.n_ranks, runs_root=self.root)

    def bad_stage_spec(self, sim_id: str) -> StageSpec:
        self.created.append(sim_id)
        return StageSpec(sim_id=sim_id, case="no-such-case", n_ranks=1, runs_root=self.root)

    def sim_spec(self, sim_id: str, staged: StagedCase) -> SimSpec:
        return _default_sim_spec(sim_id, staged, self.n_ranks, self.request_millis)

    def new_backend(self) -> Backend:
        return SimulatedBackend(self.cluster)

    def cleanup(self) -> None:
        for sim_id in self.created:
            self.backend.release(sim_id)
        elapsed = time.perf_counter() - self.started
        assert elapsed < self.real_time_limit_s, f"took {elapsed:.3f} s of real time"


def _default_sim_spec(sim_id: str, staged: StagedCase, n_ranks: int, millis: int) -> SimSpec:
    return SimSpec(
        sim_id=sim_id,
        case_dir=staged.run_dir,
        command=(staged.solver, "-parallel"),
        ranks=tuple(RankResources(millis) for _ in range(n_ranks)),
        log_path=staged.log_path,
        labels={"rankpack.io/test": "contract"},
    )


# --- helpers the tests share: every loop is bounded by the backend's clock ---------------


@dataclass
class Watch:
    """Observations of one simulation, with its solver log parsed as it arrives."""

    env: ContractEnv
    sim_id: str
    backend: Backend | None = None
    seen: list[SimObservation] = field(default_factory=list)
    log: LogParser = field(default_factory=LogParser)

    @property
    def b(self) -> Backend:
        return self.backend or self.env.backend

    def observe(self) -> SimObservation:
        obs = self.b.observe(self.sim_id)
        self.log.feed(obs.log_text)
        self.seen.append(obs)
        return obs

    def until(
        self, what: str, done: Callable[[SimObservation], bool], timeout_s: float
    ) -> SimObservation:
        """Observe every tick until ``done``; fail after ``timeout_s`` of backend clock."""
        b = self.b
        deadline = b.clock() + timeout_s
        for _ in range(100_000):
            obs = self.observe()
            if done(obs):
                return obs
            left = deadline - b.clock()
            if left <= 0:
                break
            b.wait(min(self.env.tick_s, left))
        last = self.seen[-1]
        raise AssertionError(
            f"{self.sim_id}: not {what} within {timeout_s} s; last phase {last.phase} "
            f"({last.reason or last.stage_error or 'no reason'})"
        )


def stage(env: ContractEnv, sim_id: str, length: Length = "short") -> StagedCase:
    env.backend.stage(env.stage_spec(sim_id, length))
    obs = Watch(env, sim_id).until(
        "staged", lambda o: o.phase in (SimPhase.STAGED, SimPhase.FAILED), env.stage_timeout_s
    )
    assert obs.staged is not None, f"staging failed: {obs.stage_error}"
    return obs.staged


def launch(env: ContractEnv, sim_id: str, length: Length = "short") -> tuple[SimSpec, Watch]:
    spec = env.sim_spec(sim_id, stage(env, sim_id, length))
    env.backend.launch(spec)
    return spec, Watch(env, sim_id)


def running(env: ContractEnv, sim_id: str) -> tuple[SimSpec, Watch]:
    """A long simulation, observed until every rank runs."""
    spec, watch = launch(env, sim_id, "long")
    watch.until(
        "running",
        lambda o: (
            o.phase is SimPhase.RUNNING and all(r.phase is RankPhase.RUNNING for r in o.ranks)
        ),
        env.run_timeout_s,
    )
    return spec, watch


@dataclass
class LocalEnv:
    """The local backend on this machine: real pitzDaily, Open MPI and cgroups."""

    root: Path
    n_ranks: int = 2
    request_millis: int = 500
    tick_s: float = 0.5
    stage_timeout_s: float = 300.0
    run_timeout_s: float = 300.0
    wait_slack_s: float = 1.0
    created: list[str] = field(default_factory=list)
    backends: list[Backend] = field(default_factory=list)

    def __post_init__(self) -> None:
        from rankpack.backend.local import LocalBackend

        self._backend = LocalBackend()
        self.backends.append(self._backend)

    @property
    def backend(self) -> Backend:
        return self._backend

    def stage_spec(self, sim_id: str, length: Length = "short") -> StageSpec:
        self.created.append(sim_id)
        return StageSpec(
            sim_id=sim_id, case="pitzDaily", n_ranks=self.n_ranks, runs_root=self.root,
            iterations=20 if length == "short" else 1_000_000,
        )  # fmt: skip

    def bad_stage_spec(self, sim_id: str) -> StageSpec:
        self.created.append(sim_id)
        return StageSpec(
            sim_id=sim_id, case=str(self.root / "no-such-case"), n_ranks=1, runs_root=self.root
        )

    def sim_spec(self, sim_id: str, staged: StagedCase) -> SimSpec:
        from dataclasses import replace

        from rankpack.case.openfoam import rank_env

        spec = _default_sim_spec(sim_id, staged, self.n_ranks, self.request_millis)
        return replace(spec, env=rank_env())

    def new_backend(self) -> Backend:
        from rankpack.backend.local import LocalBackend

        other = LocalBackend(reap=False)
        self.backends.append(other)
        return other

    def cleanup(self) -> None:
        import contextlib

        from rankpack.backend.protocol import UnknownSimulation

        for backend in reversed(self.backends):
            for sim_id in self.created:
                with contextlib.suppress(UnknownSimulation):
                    backend.release(sim_id)


@dataclass
class KubernetesEnv:
    """The Kubernetes backend on the dev cluster, as the rankpack-backend ServiceAccount:
    real pitzDaily in rank pods, mpirun through `pods/exec`, resizes through `pods/resize`."""

    root: Path
    cluster: Any
    """`tests.k8s.conftest.DevCluster` (up)."""
    n_ranks: int = 2
    request_millis: int = 500
    tick_s: float = 0.5
    stage_timeout_s: float = 300.0
    run_timeout_s: float = 300.0
    wait_slack_s: float = 1.0
    created: list[str] = field(default_factory=list)
    backends: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._backend = self.new_backend()

    @property
    def backend(self) -> Backend:
        return self._backend  # type: ignore[no-any-return]

    def new_backend(self) -> Backend:
        import dataclasses

        from kubernetes import client

        from rankpack.backend.kubernetes.api.config import load_config
        from rankpack.backend.kubernetes.connect import connect
        from rankpack.backend.kubernetes.objects.status import cpu_millis
        from rankpack.devcluster.nodefiles import with_node_files

        admin = client.CoreV1Api(self.cluster.admin_api())
        (node,) = admin.list_node().items
        config = load_config(
            self.cluster.up_result.service_account_kubeconfig,
            namespace=self.cluster.namespace,
            pod_subnet="10.201.0.0/24",
        )
        # usage and duty are read where the node keeps them (the host's view of the
        # dev cluster's node directories), as the CLI does
        config = dataclasses.replace(
            with_node_files(config, self.cluster.up_result.state_dir),
            allocatable_millis=cpu_millis(node.status.allocatable["cpu"]),
        )
        backend = connect(config)
        self.backends.append(backend)
        return backend

    def stage_spec(self, sim_id: str, length: Length = "short") -> StageSpec:
        self.created.append(sim_id)
        return StageSpec(
            sim_id=sim_id, case="pitzDaily", n_ranks=self.n_ranks, runs_root=self.root,
            iterations=20 if length == "short" else 1_000_000,
        )  # fmt: skip

    def bad_stage_spec(self, sim_id: str) -> StageSpec:
        self.created.append(sim_id)
        return StageSpec(
            sim_id=sim_id, case=str(self.root / "no-such-case"), n_ranks=1, runs_root=self.root
        )

    def sim_spec(self, sim_id: str, staged: StagedCase) -> SimSpec:
        from dataclasses import replace

        from rankpack.case.openfoam import rank_env

        spec = _default_sim_spec(sim_id, staged, self.n_ranks, self.request_millis)
        return replace(spec, env=rank_env())

    def cleanup(self) -> None:
        import contextlib

        from rankpack.backend.protocol import UnknownSimulation

        for backend in reversed(self.backends):
            for sim_id in self.created:
                with contextlib.suppress(UnknownSimulation):
                    backend.release(sim_id)
            backend.close()
