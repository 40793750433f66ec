"""What an admin installs to watch rankpack with Prometheus and Grafana (issue 42): alert
rules and a dashboard over the operator's and the node agents' metrics
(`rankpack.operator.metrics`, `rankpack.nodeagent.metrics`). Pure data; written to
``deploy/monitoring/`` by `rankpack.operator.deploy_files`:

- ``rules.yaml``: the rule groups as a Prometheus rule file (``promtool check rules``);
- ``prometheusrule.yaml``: the same groups as a ``PrometheusRule`` (the Prometheus
  Operator's resource), in the operator's namespace;
- ``dashboard.json``: a Grafana dashboard (its data source a variable, ``DS_PROMETHEUS``).

Each alert has a case in ``tests/monitoring/rules_test.yaml`` that makes it fire
(``promtool test rules``), and a unit test checks that every metric named here is one the
product registers (but Prometheus's own ``up``).
"""

from __future__ import annotations

import json
from typing import Any

Obj = dict[str, Any]

OPERATOR_JOB = "rankpack-operator"
AGENT_JOB = "rankpack-node-agent"
"""The scrape jobs the rules expect (``job`` labels): the operator's ``:9464/metrics`` and
each node agent's ``/metrics``."""
PROMETHEUS_OWN = frozenset({"up"})
"""Metrics the rules use that Prometheus itself records, not the product."""

RESIZE_DEFERRED_FOR = "10m"
RESIZE_HELD_FOR = "15m"
QUOTA_HELD_FOR = "30m"
AGENT_DOWN_FOR = "5m"


def _alert(name: str, expr: str, for_: str, summary: str, severity: str = "warning") -> Obj:
    rule: Obj = {"alert": name, "expr": expr}
    if for_ != "0m":
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary}
    return rule


def rule_groups() -> list[Obj]:
    """The alert rules, one group."""
    return [{
        "name": "rankpack",
        "rules": [
            _alert("RankpackResizeDeferred",
                   "max by (simulation, rank) (rankpack_rank_resize_deferred) == 1",
                   RESIZE_DEFERRED_FOR,
                   "a resize of rank {{ $labels.rank }} of {{ $labels.simulation }} has been "
                   f"deferred by its node for {RESIZE_DEFERRED_FOR}"),
            _alert("RankpackResizeHeld",
                   "max by (simulation) (rankpack_simulation_resize_held) == 1",
                   RESIZE_HELD_FOR,
                   "a grow of {{ $labels.simulation }} has been held (quota, or its node is "
                   f"full) for {RESIZE_HELD_FOR}"),
            _alert("RankpackQueueHeldForQuota",
                   'max(rankpack_launch_held{reason="quota"}) == 1', QUOTA_HELD_FOR,
                   "the head of the Simulation queue has waited for its namespace's quota "
                   f"for {QUOTA_HELD_FOR}"),
            _alert("RankpackNodeAgentDown", f'up{{job="{AGENT_JOB}"}} == 0', AGENT_DOWN_FOR,
                   "the node agent at {{ $labels.instance }} does not answer: its node's ranks "
                   "are not measured, and no resize is decided for them"),
            _alert("RankpackOperatorDown", f'absent(up{{job="{OPERATOR_JOB}"}} == 1)',
                   AGENT_DOWN_FOR, "no rankpack operator answers: no Simulation is launched, "
                   "resized or finished", "critical"),
            _alert("RankpackSimulationsFailed",
                   'sum by (code) (increase(rankpack_simulations_finished_total'
                   '{status="failed"}[15m])) > 0', "0m",
                   "Simulations failed with {{ $labels.code }} in the last 15 minutes"),
        ],
    }]  # fmt: skip


def prometheus_rule(namespace: str) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "rankpack", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "rankpack"}},
        "spec": {"groups": rule_groups()},
    }  # fmt: skip


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int,
           kind: str = "timeseries") -> Obj:  # fmt: skip
    return {
        "id": pid, "type": kind, "title": title,
        "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": legend}
                    for i, (e, legend) in enumerate(exprs)],
    }  # fmt: skip


def dashboard() -> Obj:
    """The Grafana dashboard: what runs, how busy its ranks are, what they asked for and
    got, what rankpack decided, and what it cost the apiserver."""
    panels = [
        _panel(1, "Simulations running and finished", [
            ("rankpack_simulations_running", "running"),
            ("sum by (status) (increase(rankpack_simulations_finished_total[1h]))",
             "{{status}} (last hour)")], "short", 0, 0),
        _panel(2, "Progress", [("rankpack_simulation_progress_ratio", "{{simulation}}")],
               "percentunit", 12, 0),
        _panel(3, "Rank duty (computing, outside MPI)", [
            ("rankpack_rank_duty_ratio", "{{simulation}} rank {{rank}}")], "percentunit", 0, 8,
            "heatmap"),
        _panel(4, "Requested and applied CPU per rank", [
            ("rankpack_rank_request_millicores", "{{simulation}} rank {{rank}} request"),
            ("rankpack_rank_allocated_millicores", "{{simulation}} rank {{rank}} applied")],
            "short", 12, 8),
        _panel(5, "Rank CPU on each node (node agents)", [
            ("sum by (instance, sim) (rate(rankpack_node_rank_cpu_usage_seconds_total[1m]))",
             "{{sim}} on {{instance}}"),
            ("sum by (sim) (rate(rankpack_node_rank_cpu_throttled_seconds_total[1m]))",
             "{{sim}} throttled")], "short", 0, 16),
        _panel(6, "Resizes and held launches", [
            ("sum by (outcome) (rate(rankpack_resizes_total[5m]))", "resize {{outcome}}"),
            ("sum by (reason) (rankpack_launch_held)", "queue held: {{reason}}"),
            ("sum(rankpack_rank_resize_deferred)", "deferred now"),
            ("sum(rankpack_simulation_resize_held)", "grows held now")], "short", 12, 16),
        _panel(7, "Apiserver requests per running Simulation", [
            ("sum(rate(rankpack_apiserver_requests_total[5m])) * 60 "
             "/ clamp_min(rankpack_simulations_running, 1)", "requests a minute")],
            "short", 0, 24),
        _panel(8, "Node agents", [
            (f'up{{job="{AGENT_JOB}"}}', "{{instance}} up"),
            ("sum by (code) (rate(rankpack_node_agent_requests_total[5m]))", "answers {{code}}")],
            "short", 12, 24),
    ]  # fmt: skip
    return {
        "title": "rankpack",
        "uid": "rankpack",
        "tags": ["rankpack", "mpi", "openfoam"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [{"name": "DS_PROMETHEUS", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }  # fmt: skip


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


HEADER = """\
# Generated by `python -m rankpack.operator.deploy_files deploy` from
# src/rankpack/operator/monitoring.py (a unit test keeps both identical): do not edit.
"""
