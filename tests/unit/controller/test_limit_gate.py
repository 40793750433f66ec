"""The launch gate's default model: the physical limit of co-location x its efficiency.

Cases from FACTS.md (scaled pitzDaily, 2 ranks on 2 cores): weighted 1:3 (duties ~0.33 and
~0.97, measured 1.30x of a 1.50 limit with polite waiting) packs; equal (~0.92 each,
measured 0.93x of 1.08) holds; spinning ranks (0.22x measured) always hold on a full node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from rankpack.controller.decision import QueuedSim
from rankpack.controller.policy import decide
from rankpack.controller.session import learned_efficiency
from rankpack.core.actions import WaitSetting
from rankpack.store import SessionRow

from ._helpers import GIGA, SIZED, S, launches, notes, observe, resizes, snap, state_of


@dataclass(frozen=True)
class GateCase:
    name: str
    running: tuple[tuple[float, ...], ...]
    """Per running simulation, its ranks' duty cycles."""
    head_duty: tuple[float, ...]
    """The head's learned duty cycles (empty: unknown)."""
    expected: float
    wait: WaitSetting = "polite"
    capacity: int = 2000
    efficiency: float = 0.87


def _ratio(eta: float, before: list[float], after: list[float], cores: float) -> float:
    def x(loads: list[float]) -> float:
        e = 1.0 if len(loads) < 2 else eta
        return e * len(loads) * min(1.0, cores / sum(loads))

    return x(after) / x(before)


CASES = [
    GateCase("weighted 1:3, polite: packs", ((0.33, 0.97),), (0.33, 0.97),
             _ratio(0.87, [1.30], [1.30, 1.30], 2.0)),
    GateCase("equal, polite: holds", ((0.92, 0.92),), (0.92, 0.92),
             _ratio(0.87, [1.84], [1.84, 1.84], 2.0)),
    GateCase("weighted 1:3, spin: holds", ((0.33, 0.97),), (0.33, 0.97), 0.87, wait="spin"),
    GateCase("head unknown: the running mean", ((0.2, 0.6),), (),
             _ratio(0.87, [0.8], [0.8, 0.8], 2.0)),
    GateCase("a third beside two light ones", ((0.2, 0.2), (0.2, 0.2)), (0.2, 0.2), 1.5),
    GateCase("a third on a full node", ((0.5, 0.5), (0.5, 0.5)), (0.5, 0.5), 1.0),
    GateCase("more ranks than cores: fills the node", ((0.2,) * 4,), (0.2,) * 4, 0.87),
    GateCase("4 ranks on 4 cores, light", ((0.2,) * 4,), (0.2,) * 4,
             _ratio(0.87, [0.8], [0.8, 0.8], 4.0), capacity=4000),
    GateCase("efficiency learned higher", ((0.92, 0.92),), (0.92, 0.92),
             _ratio(0.97, [1.84], [1.84, 1.84], 2.0), efficiency=0.97),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_limit_gate_prediction(case: GateCase) -> None:
    sims, mems = [], {}
    for k, duties in enumerate(case.running):
        sim_id = f"s{k}"
        ns = [round(d * GIGA) for d in duties]
        sims.append(snap(sim_id, (400,) * len(duties), compute_ns=ns,
                         mpi_ns=[GIGA - c for c in ns], wait=case.wait))  # fmt: skip
        mems[sim_id] = replace(SIZED, duty=duties)
    n = len(case.running[0])
    queue = (QueuedSim(9, n, (100,) * n, case.head_duty),)
    settings = replace(S, colocation_efficiency=case.efficiency)
    d = decide(observe(100.0, *sims, queue=queue, capacity=case.capacity),
               state_of(**mems), settings)  # fmt: skip
    reason = (launches(d) or notes(d, "launch-held"))[0].reason
    shown = float(reason.split("predicts throughput x")[1].split()[0])
    assert shown == pytest.approx(case.expected, abs=5e-4)
    assert bool(launches(d)) == (case.expected >= 1 + S.min_predicted_gain)


def test_gate_off_launches_whenever_it_fits() -> None:
    ns = round(0.97 * GIGA)
    sim = snap("a", (400, 400), compute_ns=(ns, ns), mpi_ns=(GIGA - ns,) * 2, wait="spin")
    queue = (QueuedSim(9, 2, (600, 600)),)
    state = state_of(a=replace(SIZED, duty=(0.97, 0.97)))
    off = decide(observe(100.0, sim, queue=queue, capacity=2000), state, replace(S, gate="off"))
    assert launches(off)
    assert launches(off)[0].reason.endswith("no gate (--gate off)")
    held = decide(observe(100.0, sim, queue=queue, capacity=2000), state, S)
    assert not launches(held)
    # two copies at duty 0.97 on 2 cores: a limit of ~1.03 at the default efficiency (0.78)
    # predicts a loss
    assert S.colocation_efficiency == 0.78
    # off packs a head that does not fit: everyone's requests shrink in proportion
    too_big = (QueuedSim(9, 2, (700, 700)),)
    off2 = decide(observe(100.0, sim, queue=too_big, capacity=2000), state, replace(S, gate="off"))
    (launch,) = launches(off2)
    packs = [a for a in off2.actions if getattr(a, "kind", None) == "pack"]
    assert len(packs) == 2 and sum(r.request_millis for r in packs) < 800
    assert sum(r.request_millis for r in packs) + sum(launch.request_millis) <= 2000
    assert "--gate off" in launch.reason
    # the duty model does not pack
    duty = decide(observe(100.0, sim, queue=too_big, capacity=2000), state, replace(S, gate="duty"))
    assert not launches(duty) and duty.state.launch_held == "no-room"


def _row(gain: float, limit: float | None, *, seen: int = 2, cap: int = 2000,
         wait: str = "auto", status: str = "completed", gate: float | None = None,
         sid: int = 1) -> SessionRow:  # fmt: skip
    return SessionRow(
        id=sid, started_at="", finished_at=None, status=status, owner_pid=None,
        capacity_millis=cap, max_concurrent=4, wait_mode=wait, backend="local",
        summary={"throughput_gain": gain, "throughput_limit": limit, "gate_limit": gate,
                 "max_concurrent_seen": seen},
    )  # fmt: skip


def test_efficiency_is_learned_against_the_gates_own_limit() -> None:
    """4-rank pitzDaily on 2 cores: the session's limit is 2.0, the gate's 1.0 (a simulation
    with more ranks than cores fills them). A pair measured 0.38: learned against 2.0 the
    gate would predict 0.19 for its limit of 1.0; against its own limit, 0.38."""
    rows = [_row(0.38, 2.0, gate=1.0, sid=7)]
    same = learned_efficiency(rows, capacity_millis=2000, wait_mode="auto",
                              same_workload=lambda m: m.id == 7)  # fmt: skip
    # one session of its own, weighed against the default prior (2 sessions' worth)
    assert same == (pytest.approx((0.38 + 2 * S.colocation_efficiency) / 3), 1, True)
    # a limit of 1 says how much this workload loses, not what co-location does elsewhere
    assert learned_efficiency(rows, capacity_millis=2000, wait_mode="auto") is None
    # sessions recorded before the gate's limit was kept: the session's limit
    old = learned_efficiency([_row(1.2, 1.5)], capacity_millis=2000, wait_mode="auto",
                             same_workload=lambda m: True)  # fmt: skip
    assert old == (pytest.approx((0.8 + 2 * S.colocation_efficiency) / 3), 1, True)


def test_efficiency_learned_from_comparable_sessions_only() -> None:
    rows = [
        _row(1.30, 1.50),
        _row(1.40, 1.50),
        _row(1.45, 1.50),
        _row(0.50, 1.50, seen=1),  # never co-located: ignored
        _row(0.50, 1.50, cap=4000),  # other capacity
        _row(0.50, 1.50, wait="spin"),  # other wait mode
        _row(0.50, 1.50, status="interrupted"),
        _row(0.50, 1.00),  # a limit of 1: no room to gain, says nothing
        _row(0.50, None),
    ]
    eta, n, own = learned_efficiency(rows, capacity_millis=2000, wait_mode="auto")  # type: ignore[misc]
    assert n == 3 and not own
    assert eta == pytest.approx(1.40 / 1.50)
    assert learned_efficiency(rows[3:], capacity_millis=2000, wait_mode="auto") is None
    # clamped: a session that beat its limit does not make the gate promise more than it
    high = learned_efficiency([_row(1.8, 1.5)], capacity_millis=2000, wait_mode="auto")
    assert high == (1.0, 1, False)
    # a low efficiency of other workloads is a prior only: clamped to 0.5
    low = learned_efficiency([_row(0.3, 1.5)], capacity_millis=2000, wait_mode="auto")
    assert low == (0.5, 1, False)


def test_efficiency_of_the_same_workload_wins_over_the_prior_as_sessions_accumulate() -> None:
    mine, other = _row(0.55, 2.0), _row(1.40, 1.50)  # 0.275 of the limit, 0.93 of it
    same = lambda m: m is mine  # noqa: E731
    eta, n, own = learned_efficiency(  # type: ignore[misc]
        [other, mine, other], capacity_millis=2000, wait_mode="auto", same_workload=same
    )
    # its own 0.275 against the prior of the machine's other workloads (0.93, 2 sessions)
    assert (n, own) == (1, True) and eta == pytest.approx((0.275 + 2 * 1.40 / 1.50) / 3)
    # without a session of its own the workload gets the machine's median
    eta2, n2, own2 = learned_efficiency(  # type: ignore[misc]
        [other, other], capacity_millis=2000, wait_mode="auto", same_workload=same
    )
    assert (n2, own2) == (2, False) and eta2 == pytest.approx(1.40 / 1.50)


def _weighted_pair(head_requests: tuple[int, ...], *, gate: str = "limit", floor: int = 50):  # type: ignore[no-untyped-def]
    ns = [round(0.33 * GIGA), round(0.97 * GIGA)]
    sim = snap("a", (459, 1217), compute_ns=ns, mpi_ns=[GIGA - c for c in ns])
    state = state_of(a=replace(SIZED, duty=(0.33, 0.97)))
    queue = (QueuedSim(9, 2, head_requests, (0.33, 0.97)),)
    settings = replace(S, gate=gate, floor_millis=floor, colocation_efficiency=0.87)  # type: ignore[arg-type]
    return decide(observe(100.0, sim, queue=queue, capacity=2000), state, settings)


def test_packs_when_the_requests_do_not_fit_but_the_model_predicts_a_gain() -> None:
    """Two sized copies ask 1676m each of 2000m: every request shrinks by 2000/3352, the
    running ranks first (decreases), then the head launches at the shrunk requests."""
    d = _weighted_pair((459, 1217))
    packs = resizes(d)
    assert [(r.rank, r.request_millis, r.kind) for r in packs] == [
        (0, 273, "pack"),
        (1, 726, "pack"),
    ]
    (launch,) = launches(d)
    assert launch.request_millis == (273, 726)
    assert sum(launch.request_millis) + sum(r.request_millis for r in packs) <= 2000
    assert "shrink in proportion" in launch.reason
    assert d.actions.index(packs[-1]) < d.actions.index(launch)


def test_no_packing_without_a_predicted_gain_or_with_the_duty_gate() -> None:
    ns = round(0.92 * GIGA)
    sim = snap("a", (1150, 1150), compute_ns=(ns, ns), mpi_ns=(GIGA - ns,) * 2)
    state = state_of(a=replace(SIZED, duty=(0.92, 0.92)))
    queue = (QueuedSim(9, 2, (1150, 1150), (0.92, 0.92)),)
    equal = decide(observe(100.0, sim, queue=queue, capacity=2000), state, S)
    assert not launches(equal) and not resizes(equal)
    assert equal.state.launch_held == "no-room"
    (held,) = notes(equal, "launch-held")
    assert "to pack it" in held.reason and held.code == "no-room"
    d = _weighted_pair((459, 1217), gate="duty")
    assert not launches(d) and not resizes(d)
    assert d.state.launch_held == "no-room"
    assert launches(_weighted_pair((459, 1217), gate="off"))  # off packs unconditionally


def test_no_packing_below_the_floors() -> None:
    d = _weighted_pair((459, 1217), floor=700)
    assert not launches(d) and not resizes(d)
    assert d.state.launch_held == "no-room"
    assert "floors" in notes(d, "launch-held")[0].reason


@pytest.mark.parametrize("learned", [True, False], ids=["learned", "unknown"])
def test_a_starting_copy_holds_the_head_only_while_its_duties_are_unknown(learned: bool) -> None:
    """Two queued copies of a case profiled before: the second launches while the first is
    still starting (its learned duty cycles feed the gate), not a profiling window later;
    without learned duty cycles the head waits until the first has been measured."""
    duty = (0.33, 0.97) if learned else ()
    first = replace(snap("a", (400, 600), iterations=0, compute_ns=[None, None],
                         mpi_ns=[None, None], wait="auto"),
                    starting=True, learned_duty=duty)  # fmt: skip
    queue = (QueuedSim(2, 2, (400, 600), duty),)
    d = decide(observe(5.0, first, queue=queue, capacity=2000), state_of(), S)
    assert bool(launches(d)) == learned
    if learned:
        assert "predicts throughput x" in launches(d)[0].reason
    else:
        (held,) = notes(d, "launch-held")  # the status says it waits for a measurement
        assert held.code == "measuring" and "to be profiled and sized" in held.reason


def test_a_pack_waits_for_the_starting_copy_to_run() -> None:
    """The head needs the running copy's requests shrunk (a pack); that copy is still
    starting, so nothing can be resized yet: the head waits for it to run (and says so)."""
    first = replace(snap("a", (900, 1000), iterations=0, compute_ns=[None, None],
                         mpi_ns=[None, None], wait="auto"),
                    starting=True, learned_duty=(0.33, 0.97))  # fmt: skip
    queue = (QueuedSim(2, 2, (900, 1000), (0.33, 0.97)),)
    d = decide(observe(5.0, first, queue=queue, capacity=2000), state_of(), S)
    assert not launches(d) and not resizes(d)
    assert [n.code for n in notes(d, "launch-held")] == ["measuring"]
    running = replace(first, starting=False, iterations=5)
    d = decide(observe(6.0, running, queue=queue, capacity=2000), d.state, S)
    assert launches(d) and {r.sim_id for r in resizes(d)} == {"a"}


def test_one_noisy_session_does_not_close_the_gate_but_consistent_ones_do() -> None:
    """The weighted 48 900-cell pair (limit ~1.55): packed sessions measured 0.66-0.79 of the
    limit. One at 0.66 alone would predict 0.66 x 1.55 = x1.02 and hold the pair for good;
    weighed against the prior it still packs. Three sessions at 0.5 hold it."""
    same = lambda m: True  # noqa: E731
    one = learned_efficiency([_row(0.66 * 1.55, 1.55)], capacity_millis=2000,
                             wait_mode="auto", same_workload=same)  # fmt: skip
    assert one is not None and one[0] * 1.55 >= 1 + S.min_predicted_gain
    rows = [_row(0.5 * 1.55, 1.55, sid=i) for i in range(3)]
    bad = learned_efficiency(rows, capacity_millis=2000, wait_mode="auto", same_workload=same)
    assert bad is not None and bad[0] * 1.55 < 1 + S.min_predicted_gain
    # a first session far below the prior holds at once
    far = learned_efficiency([_row(0.4 * 1.55, 1.55)], capacity_millis=2000,
                             wait_mode="auto", same_workload=same)  # fmt: skip
    assert far is not None and far[0] * 1.55 < 1 + S.min_predicted_gain
