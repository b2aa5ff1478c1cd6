"""deploy/: the Prometheus alert rules and scrape config and the Grafana dashboard use only the
metric names amqp-lab exports (a renamed metric fails here), every rule says how long, how bad
and what, and the dashboard's panels each query something. With promtool on PATH, Prometheus'
own checker reads the rules, the config and every dashboard expression too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from amqp_lab.exporters.queues import QueueProbe, QueueState, metric_families

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "amqp-lab-dashboard.json"

WORKER_METRICS = {
    "amqp_lab_consumer_processed_total",
    "amqp_lab_consumer_duplicates_total",
    "amqp_lab_consumer_requeued_total",
    "amqp_lab_consumer_retried_total",
    "amqp_lab_consumer_dead_lettered_total",
    "amqp_lab_consumer_parked_total",
    "amqp_lab_consumer_blocked_seconds_total",
    "amqp_lab_consumer_reconnects_total",
    "amqp_lab_consumer_handler_duration_seconds",
    "amqp_lab_consumer_ack_batch_deliveries",
    "amqp_lab_dedup_store_duration_seconds",
    "amqp_lab_consumer_unacked_deliveries",
}
PUBLISHER_METRICS = {
    "amqp_lab_publisher_published_total",
    "amqp_lab_publisher_confirm_duration_seconds",
    "amqp_lab_publisher_blocked_seconds_total",
    "amqp_lab_publisher_reconnects_total",
}
EXPORTER_METRICS = {
    "amqp_lab_queue_messages",
    "amqp_lab_queue_consumers",
    "amqp_lab_dlq_oldest_record_age_seconds",
    "amqp_lab_queue_probe_success",
}
OUTBOX_METRICS = {
    "amqp_lab_outbox_rows",
    "amqp_lab_outbox_oldest_pending_age_seconds",
    "amqp_lab_outbox_relay_lag_seconds",
    "amqp_lab_outbox_relayed_total",
    "amqp_lab_outbox_relays",
}
KNOWN = WORKER_METRICS | PUBLISHER_METRICS | EXPORTER_METRICS | OUTBOX_METRICS | {"up"}
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
# what is not a metric name: strings, label matchers, ranges, grouping clauses, durations
_STRIPPED = [
    re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'),
    re.compile(r"\{[^}]*\}"),
    re.compile(r"\[[^\]]*\]"),
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),
]
_IDENTIFIER = re.compile(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, histogram suffixes stripped: identifiers
    that are not function calls, keywords or numbers, once strings, label matchers, ranges and
    grouping clauses are gone."""
    for pattern in _STRIPPED:
        expr = pattern.sub(" ", expr)
    names = {name for name in _IDENTIFIER.findall(expr) if name.lower() not in KEYWORDS}
    return {HISTOGRAM_SUFFIX.sub("", name) for name in names}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    found = []
    for panel in panels:
        found.append(panel)
        found.extend(all_panels(panel.get("panels", [])))
    return found


def panel_exprs() -> list[str]:
    return [
        target["expr"]
        for panel in all_panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def template_selectors() -> list[str]:
    """The series selector of each ``label_values(SELECTOR, label)`` templating query."""
    selectors = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
        assert match, query
        selectors.append(match.group(1))
    return selectors


def test_the_extractor_finds_names_and_only_names() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, operation) (rate(amqp_lab_x_seconds_bucket{q=~"a:b"}'
        "[$__rate_interval]))) > 0.1 * (sum(rate(other_total[5m])) or up == 0) and on (vhost) "
        "foo:bar offset 5m"
    )
    assert metric_names(expr) == {"amqp_lab_x_seconds", "other_total", "up", "foo:bar"}


def test_the_exporter_exports_exactly_its_names() -> None:
    probe = QueueProbe("vh", "q:dlq", queues=[QueueState("q:dlq", 1, 0)], dlq_oldest_age=1.0)
    assert {family.name for family in metric_families(probe)} == EXPORTER_METRICS


def test_the_rules_use_only_known_metric_names() -> None:
    used = {name for rule in rules() for name in metric_names(rule["expr"])}
    assert used - KNOWN == set()
    assert used >= EXPORTER_METRICS  # each exporter metric is alerted on
    # the outbox's depth, oldest pending age and relay lag each have a rule
    assert {
        "amqp_lab_outbox_rows",
        "amqp_lab_outbox_oldest_pending_age_seconds",
        "amqp_lab_outbox_relay_lag_seconds",
    } <= used


def test_every_rule_has_for_severity_summary_and_description() -> None:
    found = rules()
    assert len(found) >= 7
    for rule in found:
        assert rule["alert"].startswith("AmqpLab"), rule
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
    assert len({rule["alert"] for rule in found}) == len(found)


def test_the_runbook_anchors_exist_in_operating_md() -> None:
    operating = (DEPLOY.parent / "docs" / "operating.md").read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in operating.splitlines()
        if line.startswith("#")
    }
    for rule in rules():
        anchors = re.findall(r"operating\.md#([a-z0-9-]+)", rule["annotations"]["description"])
        assert anchors and set(anchors) <= headings, rule["alert"]


def test_the_scrape_config_loads_the_rules_and_has_the_jobs_the_rules_name() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert [(PROMETHEUS.parent / f).resolve() for f in config["rule_files"]] == [ALERTS.resolve()]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"amqp-lab-exporter", "amqp-lab-worker", "amqp-lab-publisher", "amqp-lab-relay"} <= jobs
    named = {job for rule in rules() for job in re.findall(r'job="([^"]+)"', rule["expr"])}
    assert named and named <= jobs


def test_the_dashboard_uses_only_known_metric_names() -> None:
    exprs = panel_exprs()
    used = {name for expr in exprs for name in metric_names(expr)}
    assert used - KNOWN == set()
    assert KNOWN - used == set()  # and shows every one of them
    for selector in template_selectors():
        assert metric_names(selector) - KNOWN == set()
        pattern = re.search(r'__name__=~"([^"]+)"', selector)
        if pattern:
            assert [name for name in KNOWN if re.fullmatch(pattern.group(1), name)], selector


def test_every_dashboard_panel_queries_something_and_ids_are_unique() -> None:
    data = dashboard()
    assert data["schemaVersion"] >= 36
    panels = all_panels(data["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_the_dashboard_has_its_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"vhost", "queue"} <= variables.keys()
    exprs = panel_exprs()
    assert any("$vhost" in expr for expr in exprs) and any("$queue" in expr for expr in exprs)


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules_the_config_and_the_dashboard(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    for command in (["check", "rules", str(ALERTS)], ["check", "config", str(PROMETHEUS)]):
        result = subprocess.run([PROMTOOL, *command], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    # every dashboard expression, with Grafana's variables filled in, as a recording rule
    concrete = [
        expr.replace("$__rate_interval", "1m").replace("$vhost", ".*").replace("$queue", ".*")
        for expr in panel_exprs()
    ]
    recorded = [{"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(concrete)]
    recording = {"groups": [{"name": "dashboard", "rules": recorded}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(recording))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_names_here_are_the_ones_the_code_registers() -> None:
    """The lists above against what ConsumerMetrics and PublisherMetrics really register: a
    metric renamed in the code fails here, not on a production dashboard."""
    from prometheus_client import CollectorRegistry

    from amqp_lab.exporters.metrics import ConsumerMetrics, PublisherMetrics
    from amqp_lab.exporters.outbox_metrics import OutboxMetrics

    def registered(registry: CollectorRegistry) -> set[str]:
        names = set()
        for family in registry.collect():
            kind = family.type
            names.add(family.name + ("_total" if kind == "counter" else ""))
        return names

    consumer, publisher, outbox = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    ConsumerMetrics("v", "q", consumer)
    PublisherMetrics("v", publisher)
    OutboxMetrics("v", "db", outbox)
    assert registered(consumer) == WORKER_METRICS
    assert registered(publisher) == PUBLISHER_METRICS
    assert registered(outbox) == OUTBOX_METRICS
