# Checkpoint manifests (F16) and checkpoint garbage collection (F17).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0005_encrypt_secret_env"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="deleted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="manifest",
            field=models.JSONField(
                blank=True, default=list, help_text="[{path, size, sha256}] of every file."
            ),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="manifest_path",
            field=models.CharField(
                blank=True,
                help_text="The manifest file, relative to the job's checkpoint directory.",
                max_length=4096,
            ),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="manifest_sha256",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="metric",
            field=models.FloatField(
                blank=True, help_text="How good it is, from the job's marker.", null=True
            ),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="metric_mode",
            field=models.CharField(
                default="min", help_text="min or max: which metric is best.", max_length=3
            ),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="state",
            field=models.CharField(
                choices=[("committed", "Committed"), ("deleting", "Deleting"), ("deleted", "Deleted")],
                db_index=True,
                default="committed",
                max_length=9,
            ),
        ),
        migrations.AddField(
            model_name="jobattempt",
            name="resume_from",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="resumed_attempts",
                to="jobs.checkpoint",
            ),
        ),
    ]
