"""The deployment artefacts: production settings, the compose file, the environment list, the layout."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.fernet import Fernet

REPO = Path(__file__).resolve().parents[2]


def test_check_deploy_is_clean_with_production_settings() -> None:
    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "FIELD_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "ALLOWED_HOSTS": "portal.example.org",
        "CSRF_TRUSTED_ORIGINS": "https://portal.example.org",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_settings_refuse_to_start_without_a_secret_key() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def test_every_setting_read_from_the_environment_is_in_env_example() -> None:
    sources = (REPO / "portal" / "settings.py").read_text()
    names = set(re.findall(r'env_(?:str|bool|int|list|fernet_keys)\(\s*"([A-Z_]+)"', sources))
    listed = set(re.findall(r"^([A-Z_]+)=", (REPO / ".env.example").read_text(), re.M))
    assert names, "no settings found: the pattern is stale"
    assert names - listed == set(), f"missing from .env.example: {sorted(names - listed)}"


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_has_every_service_with_health_checks() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "agent"} <= set(services)
    for name in ("postgres", "redis", "web", "worker", "agent"):
        assert "healthcheck" in services[name], name
    assert services["agent"]["runtime"] == "nvidia"
    assert "privileged" not in services["agent"]
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert {"postgres-data", "redis-data"} <= set(compose()["volumes"])


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_docker_compose_validates_the_file(tmp_path: Path) -> None:
    shutil.copy(REPO / "docker-compose.yml", tmp_path)
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    env = {k: v for k, v in os.environ.items() if k != "POSTGRES_PASSWORD"}
    env["DOCKER_HOST"] = "unix:///nonexistent"
    config = ["docker-compose", "-f", "docker-compose.yml", "config", "-q"]
    # .env.example leaves the PostgreSQL password blank, and compose has no default for it.
    result = subprocess.run(config, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode != 0 and "POSTGRES_PASSWORD" in result.stderr
    with (tmp_path / ".env").open("a") as dotenv:
        dotenv.write(f"POSTGRES_PASSWORD={secrets.token_hex(24)}\n")  # as an admin fills it in
    result = subprocess.run(config, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    broken = compose()
    broken["services"]["web"]["ports"] = "8000:8000"  # must be a list
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(broken))
    result = subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", "config", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent"},
    )
    assert result.returncode != 0


def test_the_layout_is_as_designed() -> None:
    for path in [
        "manage.py",
        "portal",
        "scheduler",
        "agents",
        "frontend",
        "docker-compose.yml",
        "tests",
        "requirements.txt",
        "Makefile",
        "README.md",
        ".ci/run",
        "docs",
        "pyproject.toml",
    ]:
        assert (REPO / path).exists(), path
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" in line, f"unpinned requirement: {line}"
    assert "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.django_db
def test_healthz_reports_database_and_redis(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_the_image_holds_no_secrets_or_local_state() -> None:
    """Every GPU host pulls the image `COPY . .` builds: the build context must leave out the
    environment file, secrets, local state, the repository and virtualenvs."""
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for entry in [".env", "secrets/", "var/", ".git/", ".venv/", "**/node_modules/"]:
        assert entry in ignored, entry
    patterns = [entry for entry in ignored if entry and not entry.startswith("#")]
    assert not any("frontend" in entry or "dist" in entry for entry in patterns)  # the built app ships
    assert "secrets/" in (REPO / ".gitignore").read_text().splitlines()


def test_compose_has_no_default_passwords_and_keeps_monitoring_on_loopback() -> None:
    """No PostgreSQL password unless the admin sets one; Prometheus and Grafana (no auth worth the
    name) listen on the host's loopback only, and Grafana's admin password is a secret file."""
    text = (REPO / "docker-compose.yml").read_text()
    assert "change-me" not in text
    uses = re.findall(r"\$\{POSTGRES_PASSWORD[^}]*\}", text)
    assert uses and all(use.startswith("${POSTGRES_PASSWORD:?") for use in uses), uses
    assert re.search(r"^POSTGRES_PASSWORD=$", (REPO / ".env.example").read_text(), re.M)
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert all(str(port).startswith("127.0.0.1:") for port in services[name]["ports"]), name
    grafana = services["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "grafana_admin_password" in grafana["secrets"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana["environment"]


@pytest.mark.django_db
def test_healthcheck_and_scrape_work_with_production_hosts_and_tls_redirect(settings) -> None:  # type: ignore[no-untyped-def]
    """The compose health check asks http://127.0.0.1:8000/healthz and Prometheus scrapes
    http://web:8000/metrics: neither host is the public ALLOWED_HOSTS, and neither is https. Any
    other path still gets Django's host check."""
    from django.test import Client

    settings.ALLOWED_HOSTS = ["portal.example.org"]
    settings.SECURE_SSL_REDIRECT = True
    settings.METRICS_TOKEN = "t"
    client = Client(raise_request_exception=False)
    assert client.get("/healthz", HTTP_HOST="127.0.0.1:8000").status_code == 200
    scrape = client.get("/metrics", HTTP_HOST="web:8000", HTTP_AUTHORIZATION="Bearer t")
    assert scrape.status_code == 200
    assert client.get("/metrics", HTTP_HOST="web:8000", REMOTE_ADDR="10.0.0.9").status_code == 403
    assert client.get("/api/v1/", HTTP_HOST="web:8000").status_code == 400
    assert client.get("/api/v1/", HTTP_HOST="portal.example.org").status_code == 301
