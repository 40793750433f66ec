"""The simulated backend: MPI simulations on simulated nodes, in virtual time.

Implements `rankpack.backend.protocol.Backend` without OpenFOAM, MPI, cgroups or a
cluster, so the control loop (and anything else that drives a backend) is tested in
milliseconds: `SimulatedBackend.wait` advances a virtual clock to the next event instead of
sleeping, and `SimulatedBackend.clock` returns virtual seconds. Used by the unit tests of
the loop, by the backend contract suite (``tests/contract``) and by anyone who wants to try
a policy on a cluster they do not have. Deterministic: there is no randomness.

World. A `SimulatedCluster` holds the state every backend instance shares: the virtual
clock, the nodes (`SimNode`: allocatable and reserved millicores), the known cases
(`SimulatedCase`: cells, iterations, CPU cost per cell), timings (`SimTiming`), scheduled
rank faults and scripted resize outcomes. A `SimulatedBackend` is one controller process's
view of it: a second backend on the same cluster sees (`list`) and can `adopt` what the
first one launched, like a restarted controller. A backend only observes, resizes or
launches simulations it staged or adopted (`UnknownSimulation` otherwise); `stop` and
`release` work on any simulation of the cluster, are idempotent, and a released id is
unknown afterwards.

Staging. `stage` looks the case up by name (``spec.case``, or the last component of a path)
among the cluster's cases; an unknown case or an invalid spec fails at once (phase FAILED,
``stage_error``). Otherwise the case is STAGING for ``timing.stage_s``, then STAGED with a
`StagedCase`: cells split over the ranks in proportion to ``spec.decompose_weights``
(equal for ``equal`` or no weights; largest remainder, exact sum), iterations from the spec
or the case, run directory ``spec.workdir`` or ``runs_root/<sim_id>-<case>-<n>r``. The run
directory is created (empty) unless ``create_run_dirs=False``; no file is written to it,
the solver log only reaches the controller as ``log_text``.

Launch and placement. A launched simulation is PENDING (ranks PENDING, ``allocated``
unknown) for ``timing.start_s``, then RUNNING. Ranks go to ``spec.placement["node"]`` if
given, else all to the first node whose free millicores hold the whole simulation, else
rank by rank to the node with the most free millicores (overcommitting, like the local
backend). Ranks of PENDING and RUNNING simulations count as requested on their node.

Speed (contention on a node's cores). On a node of C = allocatable / 1000 cores, every
running rank i is busy all the time (computing, or spinning inside MPI) with weight
w_i = max(2, allocated request millis) and cap c_i = min(1 core, limit / 1000) (a rank is
one thread); the node's reserved millicores are one more busy task with weight and cap
equal to its reservation. Speeds are weighted max-min fair (CFS water-filling,
`simmodel.cpu_speeds`): s_i = min(c_i, lam * w_i) with lam the largest value such that the
speeds sum to at most C. When no rank reaches its cap this is s_i = C * w_i / sum_j w_j
over everything on the node. Speeds are recomputed at every event (launch, start, end,
resize settled), so they are piecewise constant.

Iterations. Rank i's work per iteration is W_i = cells_i * ``case.cell_work_s`` CPU
seconds. An iteration takes T = max_i(W_i / s_i) + ``case.mpi_s_per_iteration`` wall
seconds; rank i computes for W_i / s_i of it and waits in MPI for the rest, so its duty
cycle is d_i = (W_i / s_i) / T. A change of speeds mid-iteration keeps the fraction of the
iteration already done. The simulation SUCCEEDS (exit code 0) when it has done its
``expected_iterations`` (or, if the case sets ``converges_at`` below it, that many).

Counters per rank, integrated over virtual time: ``compute_ns`` += d_i * dt and ``mpi_ns``
+= (1 - d_i) * dt (wall time outside and inside MPI, the shim's counters; delivered only
when ``spec.shim`` is set and the rank has started); ``duty_window`` = d_i at the current
speeds; ``usage_ns`` += s_i * dt when ranks spin while waiting (the shim's wait mode
``spin``, or no shim: MPI busy-polls) and d_i * s_i * dt when they wait politely
(``polite``; ``adaptive`` is modelled as polite). Speeds do not depend on the wait mode
(a politely waiting rank's free share is not handed to the others: a known simplification).
`set_wait_mode` switches a running simulation's mode (BackendError for an unknown mode,
a simulation without the shim, or one whose ranks have not started: no record is published
yet); observations report it per rank (``wait_mode``, with the shim counters).
No throttling is modelled (``nr_throttled`` = 0).

Solver log. At the start: a header and ``Starting time loop``; per iteration k:
``Time = k``, one residual line and ``ExecutionTime = x s  ClockTime = y s`` (x: rank 0's
CPU seconds, y: whole wall seconds since the ranks started, as OpenFOAM prints them); at
the end ``End`` (after ``SIMPLE solution converged in k iterations`` if the case's
``converges_at`` comes first: the run stops there); on a rank failure mpirun's ``mpirun
noticed that process rank N ...``.
`observe` returns what was appended since the previous `observe` of that simulation by the
same backend (a backend that adopts a simulation gets the whole log first).

Resizes. `resize` REJECTS at once (``latency_s`` 0, ``desired`` unchanged) a request below
1 m, a limit below the request, a request above the node's allocatable (like the
Kubernetes 1.36 apiserver), a resize of an ended simulation, or one scripted as REJECTED.
Otherwise ``desired`` becomes the request and the resize is PENDING; after half of
``timing.resize_latency_s`` it is IN_PROGRESS, after all of it COMPLETED and ``allocated``
follows (latency 0: COMPLETED in the status `resize` returns). An increase that does not
fit the node's free millicores is DEFERRED until enough is freed (a simulation ends or is
released, a decrease settles), then IN_PROGRESS for the latency. A `ResizeScript` forces
the outcome of matching resizes: DEFERRED for ``defer_s`` (then tried again as above),
INFEASIBLE or FAILED after the latency, REJECTED at once. An accepted increase reserves its
new request on the node while in flight, so two increases cannot both take the last free
core. A later resize of the same rank supersedes one in flight; a simulation that ends
with one in flight leaves it FAILED (``simulation ended``).

Faults. `SimulatedCluster.add_fault` schedules a `RankFault` at a virtual time: the rank
FAILS and takes the simulation down (phase FAILED, reason ``rank N failed: <reason>``, exit
code 1, failure ``RankFailed``; the other ranks FAILED too), or, with ``restart=True``, its
container restarts in place: ``restarts`` + 1 and the current iteration starts over.

Failures carry a code (`SimObservation.failure`): a stopped simulation ``Stopped`` (exit
code 143 if it was launched), an unknown case ``NotACase``, an invalid stage spec
``InvalidSpec``, a run directory that cannot be created ``StageFailed``.

`wait(timeout_s)` returns at once if something happened since the previous `wait` outside
of it (a simulation stopped, a staging failed); otherwise it advances the clock to the next
event that is news (staged, started, ended, a resize settled, a rank restarted) or by
``timeout_s``, whichever is first. `changed()` names the simulations that ended, failed or
had a rank restarted since it was last called (the control loop observes those at once and
the steady others in turn). Not thread-safe: one caller at a time.

Apiserver. A cluster built with an `ApiModel` (`rankpack.testing.simapi`) counts the
requests the Kubernetes backend would make for each call and delays launches and resizes
by its latency and requests-per-second limit. The cluster's cost grows with what changes
(a thousand nodes and ten thousand ranks run in seconds of real time: `bench/scale.py`).
"""

from __future__ import annotations

from dataclasses import replace

from rankpack.backend.protocol import (
    Inventory,
    RankResources,
    ResizeStatus,
    SimObservation,
    SimRef,
    SimSpec,
    StageSpec,
    UnknownSimulation,
)
from rankpack.core.actions import WaitMode
from rankpack.testing.simcluster import SimulatedCluster


class SimulatedBackend:
    """One controller process's view of a `SimulatedCluster` (see the module docstring)."""

    name = "simulated"

    def __init__(self, cluster: SimulatedCluster | None = None) -> None:
        self.cluster = cluster if cluster is not None else SimulatedCluster()
        self._held: set[str] = set()
        self._log_offsets: dict[str, int] = {}
        self._taken: dict[str, int] = {}

    def inventory(self) -> Inventory:
        return self.cluster.inventory()

    def placement(self) -> dict[str, str]:
        return {
            "cluster": self.cluster.name,
            "nodes": ",".join(f"{n.name}:{n.allocatable_millis}m" for n in self.cluster.nodes),
        }

    def clock(self) -> float:
        return self.cluster.now

    def stage(self, spec: StageSpec) -> None:
        self.cluster.stage(spec)
        self._held.add(spec.sim_id)
        self._log_offsets[spec.sim_id] = 0

    def launch(self, spec: SimSpec) -> None:
        self._require(spec.sim_id)
        self.cluster.launch(spec)

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        self._require(sim_id)
        return self.cluster.resize(sim_id, rank, resources)

    def set_wait_mode(self, sim_id: str, mode: WaitMode) -> None:
        self._require(sim_id)
        self.cluster.set_wait_mode(sim_id, mode)

    def observe(self, sim_id: str) -> SimObservation:
        self._require(sim_id)
        obs = self.cluster.observe(sim_id)
        chunks = self.cluster.log_chunks(sim_id)
        start = self._log_offsets.get(sim_id, 0)
        self._log_offsets[sim_id] = len(chunks)
        return replace(obs, log_text="".join(chunks[start:]))

    def wait(self, timeout_s: float) -> None:
        self.cluster.wait(timeout_s)

    def changed(self) -> list[str]:
        """The simulations it holds that ended, failed or had a rank restarted since the
        last call (`rankpack.controller.schedule.Changes`: the loop observes them at once)."""
        news = self.cluster.news_seq
        out = [i for i in self._held if news.get(i, 0) > self._taken.get(i, 0)]
        for i in out:
            self._taken[i] = news[i]
        return sorted(out)

    def stop(self, sim_id: str) -> None:
        self.cluster.stop(sim_id)

    def release(self, sim_id: str) -> None:
        self.cluster.release(sim_id)
        self._held.discard(sim_id)
        self._log_offsets.pop(sim_id, None)
        self._taken.pop(sim_id, None)

    def list(self) -> tuple[SimRef, ...]:
        return self.cluster.sim_refs()

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        self.cluster.check_adoptable(sim_id, spec)
        self._held.add(sim_id)
        self._log_offsets[sim_id] = 0

    def _require(self, sim_id: str) -> None:
        self.cluster.get(sim_id)
        if sim_id not in self._held:
            raise UnknownSimulation(
                f"simulation {sim_id} was not staged or adopted by this backend; adopt it first"
            )
