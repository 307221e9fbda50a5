"""deploy/grafana/dashboards/bridge-dashboard.json: valid JSON whose every query names metrics
the code exports (read from a registry, not from a list kept by hand)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bridge.observability import BridgeMetrics
from tests.conftest import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "bridge-dashboard.json"
DATASOURCE_UID = "prometheus"
"""The uid of the provisioned datasource (deploy/grafana/provisioning/datasources)."""

_METRIC = re.compile(r"\b((?:rocketmq|bridge)_[a-z0-9_]+)")
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for item in items:
        yield item
        yield from panels(item.get("panels", []))


def queries() -> list[tuple[str, str]]:
    """(panel title or variable name, PromQL) of every query in the dashboard."""
    out = [
        (p["title"], t["expr"]) for p in panels(dashboard()["panels"]) for t in p.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        query = variable["query"]
        out.append((variable["name"], query["query"] if isinstance(query, dict) else query))
    return out


def exported() -> tuple[set[str], set[str]]:
    """Every series name the code exports, and the histograms among them."""
    metrics = BridgeMetrics(CollectorRegistry())
    families = list(metrics.registry.collect())
    histograms = {f.name for f in families if f.type == "histogram"}
    return metrics.exported_names(), histograms


def test_the_dashboard_is_valid_and_identified() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    ids = [p["id"] for p in panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]


@pytest.mark.parametrize(("where", "expr"), queries())
def test_every_query_names_an_exported_metric(where: str, expr: str) -> None:
    names, histograms = exported()
    found = _METRIC.findall(expr)
    assert found, f"{where}: no bridge metric in {expr!r}"
    for name in found:
        base = next((name[: -len(s)] for s in _HISTOGRAM_SERIES if name.endswith(s)), None)
        assert name in names or base in histograms, f"{where}: {name} is not exported"


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    text = " ".join(expr for _, expr in queries())
    for metric in (
        "rocketmq_half_messages",
        "bridge_transaction_oldest_undecided_age_seconds",
        "bridge_transaction_checks_total",
        "bridge_transaction_check_answers_total",
        "bridge_transactions_parked_total",
        "bridge_delay_waiting_messages",
        "bridge_delay_lateness_seconds_bucket",
        "bridge_retry_messages_total",
        "rocketmq_send_to_dlq_messages_total",
        "rocketmq_consumer_lag_messages",
        "rocketmq_consumer_cached_messages",
        "bridge_quarantined_messages_total",
        "bridge_kafka_transaction_aborts_total",
        "bridge_kafka_broker_rtt_seconds",
    ):
        assert metric in text, metric
