"""FakeClock: virtual time for the unit tests (kopf's habit: timers are tested without
sleeping). Called, it is the time now (``t``, seconds); `sleep` moves it on and records the
sleep. Used wherever the code under test takes a ``clock`` (and a ``sleep``)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
