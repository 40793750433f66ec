"""What the loop keeps of each observation: samples, duty marks, restarts, shared time.

`Recorder.record` takes one simulation's observation (the control loop,
`rankpack.controller.loop`, calls it for every simulation a tick observes and once more at
its end): it feeds the
solver log to the parser, keeps the CPU series and the samples (every observation, or
``sample_every_s`` apart when the loop holds more ranks than ``samples_per_s``), the shim's
duty marks, counts restarts and follows the resizes in flight
(`rankpack.controller.resizes`). `count_shared` charges the time between two ticks to the
simulations that ran beside another one then.
"""

from __future__ import annotations

from rankpack.backend.protocol import SimObservation
from rankpack.controller.outcomes import keep_mark
from rankpack.controller.resizes import Resizes
from rankpack.controller.tracked import LoopContext, Tracked
from rankpack.store import SampleRow


class Recorder:
    def __init__(self, ctx: LoopContext, resizes: Resizes) -> None:
        self.ctx = ctx
        self.resizes = resizes
        self.sample_every_s = 0.0
        """Seconds between two samples of a simulation (0: every observation)."""
        self.running_since: tuple[float, frozenset[str]] = (0.0, frozenset())
        """(time, launched simulations still running) at the end of the last tick: what
        `count_shared` charges the time since to."""

    def pace(self) -> None:
        """The samples' spacing for this tick, from the ranks the loop holds."""
        live = sum(len(s.plan.ranks) for s in self.ctx.sims.values())
        rate = self.ctx.settings.samples_per_s
        self.sample_every_s = 0.0 if live <= rate else live / max(1, rate)

    def ticked(self) -> None:
        """The end of a tick: what runs now is charged from here."""
        self.running_since = (self.ctx.now(), self.running())

    def running(self) -> frozenset[str]:
        """The launched simulations still running."""
        return frozenset(i for i, sim in self.ctx.sims.items() if sim.running)

    def count_shared(self) -> None:
        """Charge the time since the last tick to every simulation that was running then
        beside another one (before any of them is ended and recorded this tick). A change
        between ticks counts as shared for the whole tick: an overestimate of at most one
        tick, so a run recorded as alone (0 s) never overlapped another launched one."""
        since, running = self.running_since
        if len(running) < 2:
            return
        dt = max(0.0, self.ctx.now() - since)
        for sim_id in running:
            sim = self.ctx.sims.get(sim_id)
            if sim is not None and sim.shared_s is not None:
                sim.shared_s += dt

    def record(self, sim: Tracked, obs: SimObservation) -> None:
        """What ``obs`` shows of ``sim``: its log, its samples and CPU series, duty marks,
        restarts, and the state of its resizes in flight."""
        if obs.log_text:
            sim.parser.feed(obs.log_text)
        iterations = sim.parser.state.iterations
        expected = sim.staged.expected_iterations if sim.staged else 0
        t = obs.t_s - sim.t0
        # the CPU series (for CPU-seconds) and the samples: every observation unless the
        # loop holds more ranks than samples_per_s (then a simulation's are that far apart)
        sample = (
            sim.sampled_t is None
            or obs.phase.ended
            or t - sim.sampled_t >= self.sample_every_s - 1e-9
        )
        if sample:
            sim.sampled_t = t
        # per rank, in passes that each do one thing (a tick records ~1 000 ranks)
        ranks, usages = obs.ranks, sim.usages
        if sim.times and t > sim.times[-1]:  # CPU use since the last sample (the display's)
            last = sim.times[-1]
            cores = tuple(
                (r.usage_ns - u[-1]) / 1e9 / (t - last) if (u := usages[r.rank]) else 0.0
                for r in ranks
            )
        else:
            cores = (0.0,) * len(ranks)
        if sample:
            for r in ranks:
                usages[r.rank].append(r.usage_ns)
            sim.pending_samples.extend(
                SampleRow(t, r.rank, r.usage_ns, r.request_millis, r.nr_throttled, iterations,
                          r.compute_ns, r.mpi_ns)
                for r in ranks
            )  # fmt: skip
        marks = sim.duty_marks
        for r in ranks:
            if r.compute_ns is not None and r.mpi_ns is not None:
                keep_mark(marks.setdefault(r.rank, []), (iterations, r.compute_ns, r.mpi_ns),
                          expected)  # fmt: skip
        flying = self.resizes.flying_in(sim.sim_id)
        if flying or any(r.restarts for r in ranks):
            for r in ranks:
                if r.restarts > sim.restarts.get(r.rank, 0):
                    self.ctx.tally.restarts += r.restarts - sim.restarts.get(r.rank, 0)
                    self.ctx.event(sim.run_id, "restart", rank=r.rank, restarts=r.restarts)
                    sim.restarts[r.rank] = r.restarts
                if flying and r.resize is not None:  # (only a resize in flight is followed)
                    self.resizes.follow(
                        sim, r.rank, r.resize.state, r.resize.latency_s, r.resize.reason,
                        code=r.resize.code,
                    )  # fmt: skip
        if sample:
            sim.times.append(t)
        sim.cores = cores
        sim.last = obs
        sim.readings_ok = all(r.readings_ok for r in ranks)
        if len(sim.pending_samples) >= 8 * len(sim.usages):
            self.ctx.flush(sim)
        if obs.phase.ended and sim.end_t is None:
            sim.end_t = obs.t_s
