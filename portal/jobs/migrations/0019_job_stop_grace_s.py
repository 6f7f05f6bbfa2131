"""The grace period a job's stop was asked with, recorded with the ask (Job.asked_grace_s).

Stops asked before this release have none recorded; until they end, they are read with the
grace they were given then (the job's own, else the scheduler profile's)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0018_attempt_suspensions")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="stop_grace_s",
            field=models.FloatField(
                blank=True,
                help_text="The grace period (seconds) its newest stop was asked with, recorded with the ask.",
                null=True,
            ),
        ),
    ]
