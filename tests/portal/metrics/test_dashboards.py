"""The Grafana dashboards query only metrics that /metrics really exports."""

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


def exported_metrics() -> set[str]:
    exported: set[str] = set()
    for family in text_string_to_metric_families(Client().get("/metrics").content.decode()):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
    return exported


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
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    exported = exported_metrics()
    assert "GpuPortalRepeatedViolations" in {rule["alert"] for rule in rules}
    for rule in rules:
        used = set(re.findall(r"gpuportal_[a-z_]+", rule["expr"]))
        assert used and used <= exported, (rule["alert"], used - exported)
        assert rule["labels"]["severity"] in {"page", "ticket"}
