"""deploy/prometheus and deploy/grafana: the alert rules pass `promtool check rules`, each alert fires on
synthetic series (`promtool test rules alerts_test.yml`), and the rules and the dashboard name only series
GET /metrics documents (docs/operations.md, "Metrics"). promtool comes with Debian's `prometheus` package,
which `make system-deps` installs; missing, these tests fail (they are not skipped)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.metrics_doc import documented, sample_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "charon.json"

# What a PromQL expression may name besides series: functions, aggregations, keywords.
PROMQL_WORDS = frozenset(
    {
        "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "time",
        "by", "without", "on", "ignoring", "unless", "and", "or", "bool", "offset", "label_values",
    }
)  # fmt: skip


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is missing: `make system-deps` installs Debian's prometheus", pytrace=False)
    return subprocess.run([exe, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60)


def series_named(expr: str) -> set[str]:
    """The series an expression names: what is left once strings, label matchers, ranges and grouping
    clauses are taken out, less PromQL's own words."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    return set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", bare)) - PROMQL_WORDS


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_check_finds_series_and_nothing_else() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{x=~"$y", z!="w"}[5m]))) > on (q) b'
    assert series_named(expr) == {"a_bucket", "b"}
    assert series_named("label_values(charon_queues, project)") == {"charon_queues", "project"}
    assert len(documented()) >= 20


def test_promtool_checks_the_alert_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_each_alert_fires_in_promtools_unit_tests() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == {rule["alert"] for rule in rules()}


def test_the_alerts_cover_what_an_operator_is_told_and_name_documented_series_only() -> None:
    named = {rule["alert"]: series_named(rule["expr"]) for rule in rules()}
    assert set().union(*named.values()) <= sample_names()
    assert named["CharonDeadLetterQueueReceiving"] == {"charon_queue_dead_letters_received_total"}
    assert "charon_queue_oldest_message_age_seconds" in named["CharonOldestMessageTooOld"]
    assert named["CharonSweeperLagging"] == {"charon_sweeper_lag_seconds"}
    assert named["CharonNotificationsFailing"] == {"charon_notifications_total"}
    assert named["CharonNotifierLagging"] == {"charon_notifier_lag_seconds"}
    assert named["CharonQuotaNearlyUsed"] == {"charon_quota_use_ratio"}
    assert all(rule["annotations"]["summary"] and rule["labels"]["severity"] for rule in rules())


def test_the_dashboard_names_documented_series_only_and_shows_what_it_promises() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert (board["uid"], board["title"]) == ("charon-queues", "Charon")
    named: set[str] = set()
    for expr in dashboard_exprs():
        found = series_named(re.sub(r"label_values\(([^,)]+)(,[^)]*)?\)", r"\1", expr))
        assert found, expr
        named |= found
    assert named - sample_names() == set()
    assert {
        "charon_queue_messages_ready",
        "charon_queue_oldest_message_age_seconds",
        "charon_queue_dead_lettered_total",
        "charon_queue_dead_letters_received_total",
        "charon_http_requests_total",
        "charon_http_request_duration_seconds_bucket",
        "charon_notifier_backlog",
        "charon_notifier_lag_seconds",
        "charon_notifications_total",
        "charon_sweeper_lag_seconds",
    } <= named
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            refs = [t["refId"] for t in panel["targets"]]
            assert sorted(refs) == sorted(set(refs)) != [], panel["title"]
