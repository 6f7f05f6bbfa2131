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


@pytest.mark.django_db
def test_every_dashboard_query_names_an_exported_metric(users) -> None:  # type: ignore[no-untyped-def]
    exported: set[str] = set()
    for family in text_string_to_metric_families(Client().get("/metrics").content.decode()):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
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
