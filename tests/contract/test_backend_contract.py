"""The backend contract: what every backend does, whatever it runs ranks on.

Each test is bounded by the backend's clock (see `tests.contract.env.Watch.until`); for the
simulated backend each takes milliseconds of real time (checked by its env's cleanup).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from rankpack.backend.protocol import (
    BackendError,
    RankPhase,
    RankResources,
    ResizeState,
    ShimSpec,
    SimObservation,
    SimPhase,
    UnknownSimulation,
)
from tests.contract.env import ContractEnv, Watch, launch, running, stage

pytestmark = pytest.mark.contract


def new_id() -> str:
    return f"ct{uuid.uuid4().hex[:8]}"


def ended(obs: SimObservation) -> bool:
    return obs.phase.ended


def test_stage_reports_a_staged_case(env: ContractEnv) -> None:
    sim_id = new_id()
    env.backend.stage(env.stage_spec(sim_id))
    first = env.backend.observe(sim_id)
    assert first.phase in (SimPhase.STAGING, SimPhase.STAGED)
    staged = Watch(env, sim_id).until(
        "staged", lambda o: o.phase is not SimPhase.STAGING, env.stage_timeout_s
    )
    assert staged.phase is SimPhase.STAGED, staged.stage_error
    assert staged.staged is not None
    assert len(staged.staged.cells_per_rank) == env.n_ranks
    assert all(c > 0 for c in staged.staged.cells_per_rank)
    assert staged.staged.expected_iterations >= 1
    assert staged.ranks == ()


def test_stage_of_a_missing_case_fails_with_a_stage_error(env: ContractEnv) -> None:
    sim_id = new_id()
    env.backend.stage(env.bad_stage_spec(sim_id))
    obs = Watch(env, sim_id).until("ended", ended, env.stage_timeout_s)
    assert obs.phase is SimPhase.FAILED
    assert obs.stage_error
    assert obs.staged is None


def test_launch_runs_to_success_with_exit_code_0(env: ContractEnv) -> None:
    sim_id = new_id()
    # the staged case kept from staging: after the launch a backend's observations may
    # leave `staged` out (local and Kubernetes do), so they cannot be what is checked
    staged = stage(env, sim_id)
    spec = env.sim_spec(sim_id, staged)
    env.backend.launch(spec)
    watch = Watch(env, sim_id)
    obs = watch.until("ended", ended, env.run_timeout_s)
    assert obs.phase is SimPhase.SUCCEEDED, obs.reason
    assert obs.exit_code == 0
    assert all(r.phase is RankPhase.SUCCEEDED for r in obs.ranks)
    phases = [o.phase for o in watch.seen]
    assert set(phases) <= {SimPhase.STAGED, SimPhase.PENDING, SimPhase.RUNNING, SimPhase.SUCCEEDED}
    assert phases.index(SimPhase.SUCCEEDED) == len(phases) - 1
    # the solver log arrives through observe, complete and in order
    assert watch.log.state.ended
    assert watch.log.state.iterations == staged.expected_iterations
    assert watch.log.state.fatal is None
    assert len(spec.ranks) == env.n_ranks


def test_observations_describe_every_rank_and_usage_only_grows(env: ContractEnv) -> None:
    sim_id = new_id()
    spec, watch = running(env, sim_id)
    for _ in range(5):
        watch.observe()
        env.backend.wait(env.tick_s)
    obs = watch.observe()
    assert obs.sim_id == sim_id
    assert obs.phase is SimPhase.RUNNING
    assert [r.rank for r in obs.ranks] == list(range(env.n_ranks))
    for r, asked in zip(obs.ranks, spec.ranks, strict=True):
        assert r.desired == asked
        assert r.allocated is not None and r.allocated.request_millis == asked.request_millis
        assert r.restarts == 0
    times = [o.t_s for o in watch.seen]
    assert times == sorted(times)
    assert times[-1] > times[0]
    for rank in range(env.n_ranks):
        usage = [o.ranks[rank].usage_ns for o in watch.seen if o.ranks]
        assert usage == sorted(usage), f"rank {rank} usage went back: {usage}"
        assert usage[-1] > usage[0], f"rank {rank} used no CPU while running"
    total = sum(n.requested_millis for n in env.backend.inventory().nodes)
    assert total >= sum(r.request_millis for r in spec.ranks)


def test_resize_completes_and_allocated_follows(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = running(env, sim_id)
    old = env.request_millis
    new = old * 3 // 2
    status = env.backend.resize(sim_id, 0, RankResources(new))
    assert status.to_millis == new
    assert status.from_millis == old
    assert status.state in (ResizeState.PENDING, ResizeState.IN_PROGRESS, ResizeState.COMPLETED)
    obs = watch.until(
        "resized",
        lambda o: o.ranks[0].resize is not None and o.ranks[0].resize.state.final,
        env.run_timeout_s,
    )
    r0 = obs.ranks[0]
    assert r0.resize is not None and r0.resize.state is ResizeState.COMPLETED, r0.resize
    assert r0.resize.latency_s is not None and r0.resize.latency_s >= 0
    assert r0.desired.request_millis == new
    assert r0.allocated is not None and r0.allocated.request_millis == new
    assert obs.ranks[1].allocated is not None and obs.ranks[1].allocated.request_millis == old
    assert obs.phase is SimPhase.RUNNING
    assert all(r.restarts == 0 for r in obs.ranks)


def test_resize_above_allocatable_is_rejected_and_the_run_goes_on(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = running(env, sim_id)
    too_much = max(n.allocatable_millis for n in env.backend.inventory().nodes) + 1000
    status = env.backend.resize(sim_id, 1, RankResources(too_much))
    if status.state is not ResizeState.REJECTED:
        obs = watch.until(
            "rejected",
            lambda o: o.ranks[1].resize is not None and o.ranks[1].resize.state.final,
            env.run_timeout_s,
        )
        assert obs.ranks[1].resize is not None
        status = obs.ranks[1].resize
    assert status.state is ResizeState.REJECTED
    assert status.reason
    env.backend.wait(env.tick_s)
    obs = watch.observe()
    assert obs.phase is SimPhase.RUNNING
    assert obs.ranks[1].allocated is not None
    assert obs.ranks[1].allocated.request_millis == env.request_millis


def test_stop_ends_the_run_and_release_forgets_it(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = running(env, sim_id)
    env.backend.stop(sim_id)
    obs = watch.until("ended", ended, env.run_timeout_s)
    assert obs.phase is SimPhase.FAILED
    assert all(r.phase is not RankPhase.RUNNING for r in obs.ranks)
    env.backend.release(sim_id)
    with pytest.raises(UnknownSimulation):
        env.backend.observe(sim_id)
    assert sim_id not in {ref.sim_id for ref in env.backend.list()}


def test_stop_is_idempotent(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = running(env, sim_id)
    env.backend.stop(sim_id)
    env.backend.stop(sim_id)
    obs = watch.until("ended", ended, env.run_timeout_s)
    env.backend.stop(sim_id)
    assert watch.observe().phase is obs.phase is SimPhase.FAILED


def test_release_is_idempotent_and_works_after_success(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = launch(env, sim_id)
    assert watch.until("ended", ended, env.run_timeout_s).phase is SimPhase.SUCCEEDED
    env.backend.release(sim_id)
    env.backend.release(sim_id)
    env.backend.stop(sim_id)
    with pytest.raises(UnknownSimulation):
        env.backend.observe(sim_id)


def test_release_of_a_running_simulation_stops_it(env: ContractEnv) -> None:
    sim_id = new_id()
    spec, _ = running(env, sim_id)
    before = sum(n.requested_millis for n in env.backend.inventory().nodes)
    env.backend.release(sim_id)
    after = sum(n.requested_millis for n in env.backend.inventory().nodes)
    assert after <= before - sum(r.request_millis for r in spec.ranks)


def test_list_shows_launched_simulations_with_their_labels(env: ContractEnv) -> None:
    a, b = new_id(), new_id()
    spec_a, _ = running(env, a)
    launch(env, b)
    refs = {ref.sim_id: ref for ref in env.backend.list()}
    assert {a, b} <= set(refs)
    assert refs[a].phase is SimPhase.RUNNING
    for key, value in spec_a.labels.items():
        assert refs[a].labels.get(key) == value


def test_a_second_backend_adopts_a_running_simulation(env: ContractEnv) -> None:
    sim_id = new_id()
    spec, _ = running(env, sim_id)
    second = env.new_backend()
    assert sim_id in {ref.sim_id for ref in second.list()}
    second.adopt(sim_id, spec)
    watch = Watch(env, sim_id, backend=second)
    obs = watch.observe()
    assert obs.phase is SimPhase.RUNNING
    assert len(obs.ranks) == env.n_ranks
    status = second.resize(sim_id, 0, RankResources(env.request_millis // 2))
    assert status.state is not ResizeState.REJECTED, status.reason
    second.stop(sim_id)
    assert watch.until("ended", ended, env.run_timeout_s).phase is SimPhase.FAILED
    second.release(sim_id)
    with pytest.raises(UnknownSimulation):
        second.observe(sim_id)


def test_wait_returns_at_its_timeout_when_nothing_happens(env: ContractEnv) -> None:
    b = env.backend
    for timeout_s in (0.0, env.tick_s, 2 * env.tick_s):
        t0 = b.clock()
        b.wait(timeout_s)
        elapsed = b.clock() - t0
        assert timeout_s - 0.05 <= elapsed <= timeout_s + env.wait_slack_s + 1e-9


def test_wait_returns_early_when_a_simulation_ends(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = launch(env, sim_id)
    watch.until("running", lambda o: o.phase is not SimPhase.PENDING, env.run_timeout_s)
    b = env.backend
    long_s = 10 * env.run_timeout_s
    t0 = b.clock()
    for _ in range(20):  # other news may wake it first; the end must wake it in time
        b.wait(long_s)
        if watch.observe().phase.ended:
            break
    assert watch.seen[-1].phase is SimPhase.SUCCEEDED
    assert b.clock() - t0 < env.run_timeout_s


def test_unknown_simulation_ids_are_refused(env: ContractEnv) -> None:
    b = env.backend
    with pytest.raises(UnknownSimulation):
        b.observe("no-such-sim")
    with pytest.raises(UnknownSimulation):
        b.resize("no-such-sim", 0, RankResources(env.request_millis))
    with pytest.raises(UnknownSimulation):
        b.set_wait_mode("no-such-sim", "polite")


def test_set_wait_mode_switches_every_rank_live_and_back(env: ContractEnv) -> None:
    sim_id = new_id()
    spec = replace(env.sim_spec(sim_id, stage(env, sim_id, "long")), shim=ShimSpec("spin"))
    env.backend.launch(spec)
    watch = Watch(env, sim_id)
    obs = watch.until(
        "publishing shim records",
        lambda o: o.phase is SimPhase.RUNNING and all(r.wait_mode is not None for r in o.ranks),
        env.run_timeout_s,
    )
    assert {r.wait_mode for r in obs.ranks} == {"spin"}
    with pytest.raises(BackendError):
        env.backend.set_wait_mode(sim_id, "sleepy")
    for mode in ("polite", "spin"):
        env.backend.set_wait_mode(sim_id, mode)
        obs = watch.until(
            f"waiting {mode}",
            lambda o, m=mode: all(r.wait_mode == m for r in o.ranks),  # type: ignore[misc]
            env.run_timeout_s,
        )
        assert obs.phase is SimPhase.RUNNING
        assert all(r.restarts == 0 for r in obs.ranks)


def test_set_wait_mode_without_the_shim_is_refused(env: ContractEnv) -> None:
    sim_id = new_id()
    _, watch = running(env, sim_id)
    with pytest.raises(BackendError, match="without the shim"):
        env.backend.set_wait_mode(sim_id, "polite")
    assert watch.observe().phase is SimPhase.RUNNING


def test_inventory_lists_nodes_with_capacity(env: ContractEnv) -> None:
    inv = env.backend.inventory()
    assert inv.nodes
    assert all(n.allocatable_millis > 0 and n.requested_millis >= 0 for n in inv.nodes)
    assert inv.allocatable_millis == sum(n.allocatable_millis for n in inv.nodes)
    assert isinstance(env.backend.placement(), dict)
    staged = stage(env, new_id())
    assert staged.run_dir
