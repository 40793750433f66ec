"""The solver-log parser on real logs written by OpenFOAM v1912 on this machine."""

from __future__ import annotations

from pathlib import Path

from rankpack.case.foamlog import LogFollower, LogParser, parse_log

DATA = Path(__file__).parents[2] / "data"


def test_pitzdaily_log_converged() -> None:
    state = parse_log(DATA / "log.simpleFoam.pitzDaily.cut")
    assert state.time == 289
    assert state.iterations == 5  # the cut log keeps 3 steps from the start, 2 from the end
    assert state.ended and state.converged
    assert state.fatal is None
    assert state.execution_s == 3.51 and state.clock_s == 11
    assert set(state.residuals) == {"Ux", "Uy", "p", "epsilon", "k"}
    assert state.residuals["p"] == 0.000725742


def test_aerofoil_log() -> None:
    state = parse_log(DATA / "log.rhoSimpleFoam.aerofoilNACA0012")
    assert state.iterations == 3 and state.time == 3
    assert state.ended and not state.converged
    assert state.residuals["e"] == 0.2261848
    assert state.residuals["Uz"] == 0.12295325
    assert [i for i, _ in state.iteration_clock] == [1, 2, 3]
    assert state.execution_s == 0.17


def test_fatal_error_is_reported() -> None:
    state = parse_log(DATA / "log.simpleFoam.fatal")
    assert not state.ended
    assert state.fatal is not None and 'cannot find file "/tmp/bad/0/p"' in state.fatal


def test_first_residual_of_a_step_wins() -> None:
    p = LogParser()
    p.feed(
        "Time = 7\n"
        "GAMG:  Solving for p, Initial residual = 0.5, Final residual = 0.01, No Iterations 3\n"
        "GAMG:  Solving for p, Initial residual = 0.1, Final residual = 0.01, No Iterations 3\n"
        "ExecutionTime = 1.5 s  ClockTime = 2 s\n"
    )
    assert p.state.residuals == {"p": 0.5}
    assert p.state.iterations == 1


def test_follower_reads_only_appended_text_and_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.x"
    follower = LogFollower(log)
    assert follower.poll().iterations == 0  # file not there yet
    log.write_text("Time = 1\nExecutionTime = 0.1 s  Clock")
    assert follower.poll().iterations == 0  # the second line is incomplete
    with open(log, "a") as fh:
        fh.write("Time = 1 s\nTime = 2\nExecutionTime = 0.2 s  ClockTime = 1 s\nEnd\n")
    state = follower.poll()
    assert state.iterations == 2 and state.time == 2 and state.ended
