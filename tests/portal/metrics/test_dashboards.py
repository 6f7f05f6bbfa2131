"""The Grafana dashboards and the alert rules query only metrics that /metrics really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"

# PromQL words that are neither metrics nor functions (a function is a name before "(").
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def exported_metrics() -> set[str]:
    exported: set[str] = set()
    for family in text_string_to_metric_families(Client().get("/metrics").content.decode()):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
    return exported


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression reads, whatever its prefix, so that a misspelt name is
    caught too: what is left of the names once label values, label matchers, ranges and label
    lists (by, on, ...) are taken out, less functions, aggregations and keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*\b(?!\s*\()", expr))
    return names - PROMQL_KEYWORDS


def alert_groups() -> dict[str, list[dict]]:
    """The rules of deploy/prometheus/alerts.yml by group name."""
    return {group["name"]: group["rules"] for group in yaml.safe_load(ALERTS.read_text())["groups"]}


@pytest.mark.django_db
def test_every_dashboard_query_names_an_exported_metric(users) -> None:  # type: ignore[no-untyped-def]
    exported = exported_metrics()
    assert len(DASHBOARDS) == 3
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["panels"], path.name
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == "prometheus"
            for target in panel["targets"]:
                used = set(re.findall(r"gpuportal_[a-z_]+", target["expr"]))
                assert used, (path.name, panel["title"])
                assert used <= exported, (path.name, panel["title"], used - exported)


def test_the_monitoring_profile_scrapes_the_portal_with_the_token() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name in ("prometheus", "grafana"):
        assert compose["services"][name]["profiles"] == ["monitoring"]
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())[
        "scrape_configs"
    ][0]
    assert scrape["metrics_path"] == "/metrics" and scrape["static_configs"][0]["targets"] == ["web:8000"]
    assert scrape["authorization"]["type"] == "Bearer"
    assert scrape["honor_labels"] is True  # the GPU series' `job` (a job id) stays `job`
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["uid"] == "prometheus"


@pytest.mark.django_db
def test_the_alert_rules_are_loaded_and_read_exported_metrics(users) -> None:  # type: ignore[no-untyped-def]
    """A rule on a metric name that /metrics does not export would never fire, silently."""
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounted = dict(volume.split(":")[:2] for volume in compose["services"]["prometheus"]["volumes"])
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert mounted["./deploy/prometheus/alerts.yml"] == "/etc/prometheus/alerts.yml"
    groups = alert_groups()
    assert set(groups) == {"gpuportal-security", "gpuportal-operations"}
    assert "GpuPortalRepeatedViolations" in {rule["alert"] for rule in groups["gpuportal-security"]}
    exported = exported_metrics()
    for name, rules in groups.items():
        for rule in rules:
            used = metric_names(rule["expr"])
            assert used and used <= exported, (name, rule["alert"], used - exported)
            assert rule["labels"]["severity"] in {"page", "ticket"}


def test_metric_names_finds_every_metric_and_nothing_else() -> None:
    """The check above is only as good as this reading of PromQL."""
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(cycle_seconds_bucket{vc=~"a|b"}[10m]))) > 5 '
        "and on () count(count by (node) (node_gpus)) - (max(agents offset 5m) or vector(0)) > 1e3"
    )
    assert metric_names(expr) == {"cycle_seconds_bucket", "node_gpus", "agents"}
    assert metric_names("gpuportl_node_gpus < gpuportal_node_gpus") == {
        "gpuportl_node_gpus",
        "gpuportal_node_gpus",
    }


def test_the_operations_rules_wait_and_tell_the_operator_where_to_look() -> None:
    rules = alert_groups()["gpuportal-operations"]
    assert {rule["alert"] for rule in rules} >= {
        "GpuPortalUnhealthyGpus",
        "GpuPortalNodesNotReporting",
        "GpuPortalSlowSchedulingCycles",
        "GpuPortalSchedulingStopped",
        "GpuPortalJobsWaitWithFreeGpus",
        "GpuPortalManyJobsLost",
        "GpuPortalVcOverQuota",
    }
    for rule in rules:
        assert re.fullmatch(r"\d+[mh]", rule["for"]), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        description = rule["annotations"]["description"]
        assert "docs/operations.md" in description, rule["alert"]
