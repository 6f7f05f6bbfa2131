"""The periods in which time-sliced attempts were suspended.

Usage, budgets and the scheduler's attained service leave these periods out. Suspensions that
ended before this release were not recorded, so they still count as run time, as they did. A
job suspended now gets its open suspension, from its last move to `suspended` (its job event),
so that the rest of the wait it is in is left out when it resumes."""

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone


def open_current_suspensions(apps, schema_editor):  # type: ignore[no-untyped-def]
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    JobEvent = apps.get_model("jobs", "JobEvent")
    Suspension = apps.get_model("jobs", "Suspension")
    suspended = JobAttempt.objects.filter(state="suspended", job__state="suspended", ended_at__isnull=True)
    for attempt in suspended.order_by("job_id", "-number").distinct("job_id"):
        events = JobEvent.objects.filter(job_id=attempt.job_id, to_state="suspended")
        event = events.order_by("-created_at", "-id").first()
        started_at = event.created_at if event is not None else timezone.now()
        Suspension.objects.create(attempt=attempt, started_at=started_at)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0017_template_env_values_as_text")]

    operations = [
        migrations.CreateModel(
            name="Suspension",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField()),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                (
                    "attempt",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="suspensions",
                        to="jobs.jobattempt",
                    ),
                ),
            ],
            options={
                "ordering": ["attempt", "started_at"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("ended_at__isnull", True)),
                        fields=("attempt",),
                        name="one_open_suspension_per_attempt",
                    )
                ],
            },
        ),
        migrations.RunPython(open_current_suspensions, migrations.RunPython.noop),
    ]
