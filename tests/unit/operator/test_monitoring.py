"""deploy/monitoring (issue 42): every metric its rules and dashboard use is registered by
the operator or the node agent (or is Prometheus's own ``up``), and every alert has a
``promtool test rules`` case (tests/monitoring/rules_test.yaml; promtool itself runs in
tests/integration/test_monitoring.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from rankpack.backend.kubernetes.api.kubeapi import RequestCounter
from rankpack.nodeagent.metrics import AgentMetrics
from rankpack.operator import monitoring
from rankpack.operator.metrics import OperatorMetrics

REPO = Path(__file__).resolve().parents[3]
_METRIC = re.compile(r"\b(rankpack_[a-z_]+|up)\b")
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def _registered() -> set[str]:
    names: set[str] = set()
    for registry in (OperatorMetrics(RequestCounter()).registry, AgentMetrics().registry):
        names |= {m.name for m in registry.collect()}
    return names


def _used(text: str) -> set[str]:
    found = set()
    for name in _METRIC.findall(text):
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        found.add(name)
    return found


def _exprs() -> list[str]:
    rules = [r["expr"] for g in monitoring.rule_groups() for r in g["rules"]]
    targets = [t["expr"] for p in monitoring.dashboard()["panels"] for t in p["targets"]]
    return rules + targets


def test_every_metric_the_rules_and_dashboard_use_is_registered() -> None:
    used = set().union(*(_used(e) for e in _exprs()))
    unknown = used - _registered() - monitoring.PROMETHEUS_OWN
    assert not unknown, f"not registered by the product: {sorted(unknown)}"
    assert {"rankpack_rank_resize_deferred", "rankpack_simulation_resize_held",
            "rankpack_launch_held", "rankpack_simulations_finished"} <= used  # fmt: skip


def test_a_misspelt_metric_would_be_found() -> None:
    assert _used("rate(rankpack_resizez_total[5m])") - _registered() == {"rankpack_resizez"}


def test_every_alert_has_a_promtool_case_that_fires_it() -> None:
    alerts = {r["alert"] for g in monitoring.rule_groups() for r in g["rules"]}
    cases = yaml.safe_load((REPO / "tests/monitoring/rules_test.yaml").read_text())
    firing = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"]
              if t["exp_alerts"]}  # fmt: skip
    quiet = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"]
             if not t["exp_alerts"]}  # fmt: skip
    assert firing == alerts and quiet == alerts  # each fires, and not before its bound


def test_the_dashboard_is_grafana_json_with_a_data_source_variable() -> None:
    board = json.loads((REPO / "deploy/monitoring/dashboard.json").read_text())
    assert board == monitoring.dashboard()
    assert {v["name"] for v in board["templating"]["list"]} == {"DS_PROMETHEUS"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] for p in board["panels"])
