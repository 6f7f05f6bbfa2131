"""S14, at rest: job secret variables are stored encrypted under FIELD_ENCRYPTION_KEYS.

The database (a dump, a replica, a backup) holds only Fernet tokens; the job's agents still get
the values; keys rotate with `manage.py rotate_encryption_keys`; and a value that no configured
key opens is a loud error, never an empty set of variables.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from portal.lib.encryption import UndecryptableValue

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_live_8f3e2a91c0d74b6e"


def raw_row(job_id: int) -> str:
    """The job's whole row as PostgreSQL stores it, every column as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(j)::text FROM jobs_job j WHERE id = %s", [job_id])
        return cursor.fetchone()[0]


def raw_secret_env(job_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret_env FROM jobs_job WHERE id = %s", [job_id])
        return cursor.fetchone()[0]


@pytest.fixture
def secret_job(api_for: Any, small_job: dict[str, Any], invariants_checked: set[int]) -> int:
    spec = {**small_job, "env": {"PLAIN": "1"}, "secret_env": {"HF_TOKEN": SECRET}}
    created = api_for("alice").post("/api/v1/jobs/", spec, format="json")
    assert created.status_code == 201, created.json()
    invariants_checked.add(created.json()["id"])
    return int(created.json()["id"])


def test_the_database_holds_no_secret_value_and_the_agents_get_it(secret_job: int) -> None:
    from portal.accounts.models import AuditEntry
    from portal.agentgw.desired import desired_set_for
    from portal.cluster.models import Node
    from portal.jobs.models import Job, JobEvent
    from scheduler.tasks import run_cycle

    assert SECRET not in raw_row(secret_job)
    token = raw_secret_env(secret_job)
    assert token.startswith("gAAAA")  # a Fernet token, version byte 0x80
    assert Job.objects.get(pk=secret_job).secret_env == {"HF_TOKEN": SECRET}
    for model in (JobEvent, AuditEntry):
        for values in model.objects.values():
            assert SECRET not in repr(values)

    Node.objects.update(state="ready")
    run_cycle()
    node = Job.objects.get(pk=secret_job).attempts.get().allocations.first().node
    assert SECRET not in raw_row(secret_job)  # scheduling rewrote the row, still encrypted
    desired = [a for a in desired_set_for(node).attempts if a.job_id == str(secret_job)]
    assert desired[0].env == {"PLAIN": "1", "HF_TOKEN": SECRET}


def test_a_job_without_secrets_stores_an_empty_value(api_for: Any, small_job: dict[str, Any]) -> None:
    from portal.jobs.models import Job

    created = api_for("alice").post("/api/v1/jobs/", small_job, format="json")
    job_id = created.json()["id"]
    assert raw_secret_env(job_id) == ""
    assert Job.objects.get(pk=job_id).secret_env == {}


def test_keys_rotate_and_old_keys_can_then_be_removed(secret_job: int, settings: Any) -> None:
    from portal.accounts.models import TotpDevice
    from portal.devstack import DEMO_ADMIN_TOTP_SECRET
    from portal.jobs.models import Job

    old = settings.FIELD_ENCRYPTION_KEYS[0]
    new = Fernet.generate_key().decode()
    before = raw_secret_env(secret_job)
    settings.FIELD_ENCRYPTION_KEYS = [new, old]  # the new key goes first; the old one still opens
    assert Job.objects.get(pk=secret_job).secret_env == {"HF_TOKEN": SECRET}

    call_command("rotate_encryption_keys", stdout=open(os.devnull, "w"))  # noqa: SIM115
    after = raw_secret_env(secret_job)
    assert after != before and SECRET not in after

    settings.FIELD_ENCRYPTION_KEYS = [new]  # the old key is gone
    assert Job.objects.get(pk=secret_job).secret_env == {"HF_TOKEN": SECRET}
    admin_key = TotpDevice.objects.get(user__username="admin").secret  # every encrypted column
    assert admin_key == DEMO_ADMIN_TOTP_SECRET
    settings.FIELD_ENCRYPTION_KEYS = [old]  # and no longer opens anything
    with pytest.raises(UndecryptableValue):
        Job.objects.get(pk=secret_job).secret_env  # noqa: B018

    settings.FIELD_ENCRYPTION_KEYS = [old, new]  # back to the test settings' key, the same way
    call_command("rotate_encryption_keys", stdout=open(os.devnull, "w"))  # noqa: SIM115
    settings.FIELD_ENCRYPTION_KEYS = [old]
    assert Job.objects.get(pk=secret_job).secret_env == {"HF_TOKEN": SECRET}


def test_a_wrong_key_is_a_clear_error_not_an_empty_dict(
    secret_job: int, small_job: dict[str, Any], api_for: Any, settings: Any
) -> None:
    """Only what reads the secrets fails, and loudly: the job's desired set (so its node's agent
    gets no half-configured job), the rotation command. Lists, scheduling cycles and saves of the
    job never decrypt them, so they go on, and a save writes the stored token back unchanged."""
    from portal.accounts.models import TotpDevice
    from portal.agentgw.desired import desired_set_for
    from portal.cluster.models import Node
    from portal.jobs.models import Job
    from scheduler.tasks import run_cycle

    # Authenticator keys are encrypted too, and the rotation command reads them first; this test
    # is about the job's row, so no authenticator may be the row it names.
    TotpDevice.objects.all().delete()
    plain_job = api_for("alice").post("/api/v1/jobs/", small_job, format="json").json()["id"]
    token = raw_secret_env(secret_job)
    configured = settings.FIELD_ENCRYPTION_KEYS
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]

    job = Job.objects.get(pk=secret_job)
    with pytest.raises(
        UndecryptableValue, match=r"Job\.secret_env cannot be decrypted .* FIELD_ENCRYPTION_KEYS"
    ):
        job.secret_env  # noqa: B018
    assert Job.objects.get(pk=plain_job).secret_env == {}  # nothing to decrypt there
    Job.objects.get(pk=secret_job).save()
    assert raw_secret_env(secret_job) == token
    assert api_for("alice").get(f"/api/v1/jobs/{secret_job}/").status_code == 200
    assert api_for("alice").get("/api/v1/jobs/").json()["count"] == 2

    Node.objects.update(state="ready")
    run_cycle()
    node = Job.objects.get(pk=secret_job).attempts.get().allocations.first().node
    with pytest.raises(UndecryptableValue):
        desired_set_for(node)
    with pytest.raises(CommandError, match=f"row {secret_job} cannot be decrypted"):
        call_command("rotate_encryption_keys")
    settings.FIELD_ENCRYPTION_KEYS = configured  # the invariants check reads every job after the test
    assert raw_secret_env(secret_job) == token


def test_the_migration_encrypts_rows_stored_in_the_clear(secret_job: int) -> None:
    from portal.jobs.models import Job

    migration = importlib.import_module("portal.jobs.migrations.0005_encrypt_secret_env")
    with connection.cursor() as cursor:  # as 0004 left it: JSON text in the clear
        cursor.execute(
            "UPDATE jobs_job SET secret_env = %s WHERE id = %s", [f'{{"HF_TOKEN": "{SECRET}"}}', secret_job]
        )
        cursor.execute("UPDATE jobs_job SET secret_env = '{}' WHERE id <> %s", [secret_job])

    class SchemaEditor:
        pass

    editor = SchemaEditor()
    editor.connection = connection  # type: ignore[attr-defined]
    migration.encrypt_rows(None, editor)
    assert SECRET not in raw_row(secret_job)
    assert Job.objects.get(pk=secret_job).secret_env == {"HF_TOKEN": SECRET}
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM jobs_job WHERE secret_env = '{}'")
        assert cursor.fetchone()[0] == 0


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (None, "FIELD_ENCRYPTION_KEYS is required"),
        ("not-a-key", "FIELD_ENCRYPTION_KEYS: key 1 is not a Fernet key"),
    ],
)
def test_production_settings_refuse_to_start_without_usable_keys(keys: str | None, message: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIELD_ENCRYPTION_KEYS")}
    env.update({"DEBUG": "false", "SECRET_KEY": "k" * 60, "ALLOWED_HOSTS": "portal.example.org"})
    if keys is not None:
        env["FIELD_ENCRYPTION_KEYS"] = keys
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert message in result.stderr
