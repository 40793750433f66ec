"""Launching only what was staged ahead (`ControllerSettings.launch_staged_only`, the
operator, issue 39): a case still staging (maybe a hostile one, to the admin's deadline)
holds no place and no other launch; a failed staging is claimed at once to record it."""

from __future__ import annotations

from dataclasses import replace

from rankpack.controller.decision import ControllerSettings, QueuedSim
from rankpack.controller.policy import decide

from ._helpers import launches, observe, state_of

S = ControllerSettings(launch_staged_only=True, launch_cooldown_s=0.0)
STAGING = QueuedSim(queue_id=1, n_ranks=2, initial_request_millis=(500, 500), ahead="s1",
                    ready=False)  # fmt: skip
READY = QueuedSim(queue_id=2, n_ranks=2, initial_request_millis=(500, 500), ahead="s2")
FAILED = QueuedSim(queue_id=3, n_ranks=2, initial_request_millis=(500, 500), ahead="s3",
                   ready=False, stage_failed=True)  # fmt: skip


def test_a_case_still_staging_is_passed_over_for_one_that_is_staged() -> None:
    d = decide(observe(10.0, queue=[STAGING, READY], capacity=2000), state_of(), S)
    assert [x.queue_id for x in launches(d)] == [READY.queue_id]


def test_nothing_launches_while_every_case_still_stages() -> None:
    d = decide(observe(10.0, queue=[STAGING], capacity=2000), state_of(), S)
    assert launches(d) == []


def test_a_failed_staging_is_claimed_even_without_room() -> None:
    d = decide(observe(10.0, queue=[FAILED, STAGING], capacity=0), state_of(), S)
    assert [x.queue_id for x in launches(d)] == [FAILED.queue_id]


def test_without_the_setting_the_head_is_staged_when_it_passes() -> None:
    d = decide(observe(10.0, queue=[STAGING, READY], capacity=2000), state_of(),
               replace(S, launch_staged_only=False))  # fmt: skip
    assert [x.queue_id for x in launches(d)][:1] == [STAGING.queue_id]
