"""The node agent's Prometheus metrics (the ``prometheus-client`` package).

Per rank on this node (of a rank pod, or of a group pod: one series per rank), read at each
scrape (labels ``namespace``, ``pod``, ``sim``, ``rank``):
``rankpack_node_rank_cpu_usage_seconds_total``, ``rankpack_node_rank_cpu_throttled_periods_total``,
``rankpack_node_rank_cpu_throttled_seconds_total``,
``rankpack_node_rank_cpu_pressure_seconds_total`` (label ``kind``: some, full; cgroup v2
only), ``rankpack_node_rank_duty_ratio`` (the shim's latest window) and
``rankpack_node_rank_wait_mode`` (1 for the mode in use, label ``mode``). Of the agent:
``rankpack_node_agent_requests_total`` by ``route`` and ``code``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rankpack.backend.kubernetes.nodes.nodereader import NodeRankReading, RankPod

Readings = Callable[[], list[tuple[RankPod, NodeRankReading]] | None]
LABELS = ["namespace", "pod", "sim", "rank"]


class _RankCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        usage = CounterMetricFamily(
            "rankpack_node_rank_cpu_usage_seconds",
            "CPU time of a rank (its pod's cgroup; in a group pod, its process)",
            labels=LABELS,
        )
        periods = CounterMetricFamily(
            "rankpack_node_rank_cpu_throttled_periods",
            "CFS periods in which a rank's pod was throttled",
            labels=LABELS,
        )
        throttled = CounterMetricFamily(
            "rankpack_node_rank_cpu_throttled_seconds",
            "time a rank's pod was throttled",
            labels=LABELS,
        )
        pressure = CounterMetricFamily(
            "rankpack_node_rank_cpu_pressure_seconds",
            "time tasks of a rank's pod waited for a CPU (PSI)",
            labels=[*LABELS, "kind"],
        )
        duty = GaugeMetricFamily(
            "rankpack_node_rank_duty_ratio",
            "compute / (compute + MPI) over the shim's latest window",
            labels=LABELS,
        )
        mode = GaugeMetricFamily("rankpack_node_rank_wait_mode",
                                 "the wait mode a rank used at its latest wait (1)",
                                 labels=[*LABELS, "mode"])  # fmt: skip
        for who, r in self.metrics.readings() or []:
            key = [who.namespace, who.name, who.sim, str(who.rank)]
            if r.cpu is not None:
                usage.add_metric(key, r.cpu.usage_ns / 1e9)
                periods.add_metric(key, r.cpu.nr_throttled)
                throttled.add_metric(key, r.cpu.throttled_ns / 1e9)
            if r.psi is not None:
                pressure.add_metric([*key, "some"], r.psi.some_total_us / 1e6)
                if r.psi.full_total_us is not None:
                    pressure.add_metric([*key, "full"], r.psi.full_total_us / 1e6)
            if r.shim is not None and r.shim.duty_window is not None:
                duty.add_metric(key, r.shim.duty_window)
            if r.shim is not None and r.shim.wait_mode:
                mode.add_metric([*key, r.shim.wait_mode], 1)
        yield from (usage, periods, throttled, pressure, duty, mode)


class AgentMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.readings: Readings = lambda: None
        """This node's rank pods and readings (the agent sets it)."""
        self.requests = Counter("rankpack_node_agent_requests", "requests answered",
                                ["route", "code"], registry=self.registry)  # fmt: skip
        self.registry.register(_RankCollector(self))

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def text(self) -> bytes:
        return bytes(generate_latest(self.registry))
