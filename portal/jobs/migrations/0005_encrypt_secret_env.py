# Job.secret_env moves from a JSON column in the clear to a text column holding a Fernet token
# (portal.lib.encryption); the rows already stored are encrypted here, with the first key of
# FIELD_ENCRYPTION_KEYS. An empty object is stored as the empty string.

import json

from django.db import migrations

import portal.lib.encryption


def encrypt_rows(apps, schema_editor):
    from portal.lib.encryption import encrypt_text

    with schema_editor.connection.cursor() as cursor:
        cursor.execute("UPDATE jobs_job SET secret_env = '' WHERE secret_env = '{}'")
        cursor.execute("SELECT id, secret_env FROM jobs_job WHERE secret_env <> '' ORDER BY id")
        rows = cursor.fetchall()
        for pk, plain in rows:
            value = json.dumps(json.loads(plain), separators=(",", ":"), sort_keys=True)
            cursor.execute("UPDATE jobs_job SET secret_env = %s WHERE id = %s", [encrypt_text(value), pk])


def decrypt_rows(apps, schema_editor):
    from portal.lib.encryption import decrypt_text

    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT id, secret_env FROM jobs_job WHERE secret_env <> '' ORDER BY id")
        rows = cursor.fetchall()
        for pk, token in rows:
            plain = decrypt_text(token, f"Job.secret_env of job {pk}")
            cursor.execute("UPDATE jobs_job SET secret_env = %s WHERE id = %s", [plain, pk])
        cursor.execute("UPDATE jobs_job SET secret_env = '{}' WHERE secret_env = ''")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_job_secret_env"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="secret_env",
            field=portal.lib.encryption.EncryptedJSONField(blank=True, default=dict),
        ),
        migrations.RunPython(encrypt_rows, decrypt_rows),
    ]
